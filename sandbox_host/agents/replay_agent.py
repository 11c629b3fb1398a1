#!/usr/bin/env python3
"""The replay agent: writes a recorded journal to stdout with its original pacing.

Standard library only: this file is copied into the sandbox and run with the sandbox's
``python3`` (docs/design.md §5.3). The journal it replays is a sandbox-local copy made by the
host, which checked the source against ``BATON_REPLAY_DIRS`` before copying.

Pacing: a line with a top-level ISO-8601 ``timestamp`` (Claude 2.1.x writes one on some
lines) waits for the time since the previous timestamped line; a line without one waits
``--delay`` seconds. Every wait is divided by ``--speed`` and capped at ``--max-gap``.
Bytes are written unchanged (a trailing fragment without ``\\n`` stays a fragment), one
line per ``write`` so a follower sees whole lines as they are paced. Exits 0.

Tool approvals (docs/hitl.md): a recorded ``control_request`` (``can_use_tool``) line is
written, then the agent waits on stdin for the ``control_response`` with its request id
(other lines are ignored). Allow: the recording goes on. Deny: a ``user`` line with an error
``tool_result`` (the denial's message) for that ``tool_use_id`` is written instead of the
recorded ``user`` line(s) holding that tool's result, which are skipped. End of stdin while
waiting counts as a denial ("no answer"). Recorded ``baton_input`` lines (what a relay wrote
in the recorded run) are skipped: this run's relay writes its own.

Usage: ``python3 replay_agent.py --journal FILE [--speed X] [--delay S] [--max-gap S]``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime


def _timestamp(line: bytes) -> float | None:
    """Seconds since the epoch of the line's top-level ``timestamp``, if it has one."""
    if b'"timestamp"' not in line:
        return None
    try:
        obj = json.loads(line)
        raw = obj.get("timestamp") if isinstance(obj, dict) else None
        if not isinstance(raw, str):
            return None
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _json(line: bytes) -> dict | None:  # type: ignore[type-arg]
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _ask(line: bytes) -> tuple[str, str] | None:
    """(request id, tool_use id) of a recorded ``can_use_tool`` control request."""
    if b'"control_request"' not in line:
        return None
    obj = _json(line)
    req = obj.get("request") if obj and obj.get("type") == "control_request" else None
    if not isinstance(req, dict) or req.get("subtype") != "can_use_tool":
        return None
    return str(obj.get("request_id", "")), str(req.get("tool_use_id", ""))  # type: ignore[union-attr]


def _results_for(line: bytes, tool_use_id: str) -> bool:
    """Whether a recorded line is a ``user`` line holding ``tool_use_id``'s result."""
    if tool_use_id.encode() not in line or b'"tool_result"' not in line:
        return False
    obj = _json(line)
    msg = obj.get("message") if obj and obj.get("type") == "user" else None
    content = msg.get("content") if isinstance(msg, dict) else None
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id") == tool_use_id for b in content)


def wait_answer(request_id: str, stdin) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """The answer's inner response read from ``stdin``; a denial "no answer" at its end."""
    for raw in stdin:
        obj = _json(raw)
        resp = obj.get("response") if obj and obj.get("type") == "control_response" else None
        if isinstance(resp, dict) and resp.get("request_id") == request_id:
            inner = resp.get("response")
            return inner if isinstance(inner, dict) else {"behavior": "deny", "message": "malformed answer"}
    return {"behavior": "deny", "message": "no answer"}


def _denied(tool_use_id: str, message: str) -> bytes:
    return json.dumps({"type": "user", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool_use_id, "content": message, "is_error": True}]},
        "parent_tool_use_id": None}, separators=(",", ":")).encode()


def replay(path: str, speed: float, delay: float, max_gap: float, out_fd: int = 1, stdin=None) -> None:  # type: ignore[no-untyped-def]
    """Write the journal at ``path`` to ``out_fd`` with its pacing and approvals (see module docstring)."""
    with open(path, "rb") as f:
        content = f.read()
    lines = content.split(b"\n")
    last_ts: float | None = None
    denied: set[str] = set()
    for i, line in enumerate(lines):
        is_last = i == len(lines) - 1
        if is_last and line == b"":
            break  # the file ended with "\n"
        if b'"baton_input"' in line and (_json(line) or {}).get("type") == "baton_input":
            continue
        if denied and any(_results_for(line, t) for t in denied):
            continue
        ts = _timestamp(line)
        if ts is not None and last_ts is not None:
            wait = max(0.0, ts - last_ts)
        elif i == 0:
            wait = 0.0
        else:
            wait = delay
        if ts is not None:
            last_ts = ts
        if speed > 0 and wait > 0:
            time.sleep(min(wait / speed, max_gap))
        _write_all(out_fd, line if is_last else line + b"\n")
        asked = _ask(line)
        if asked is not None:
            answer = wait_answer(asked[0], stdin if stdin is not None else sys.stdin.buffer)
            if answer.get("behavior") != "allow":
                denied.add(asked[1])
                _write_all(out_fd, _denied(asked[1], str(answer.get("message") or "denied")) + b"\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--journal", required=True, help="the sandbox-local journal copy")
    p.add_argument("--speed", type=float, default=1.0, help="pacing divisor; 0 = no waits")
    p.add_argument("--delay", type=float, default=0.0, help="seconds before a line without timestamp")
    p.add_argument("--max-gap", type=float, default=5.0, help="longest single wait, seconds")
    args = p.parse_args(argv)
    replay(args.journal, args.speed, args.delay, args.max_gap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
