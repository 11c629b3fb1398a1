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


def replay(path: str, speed: float, delay: float, max_gap: float, out_fd: int = 1) -> None:
    """Write the journal at ``path`` to ``out_fd`` with its pacing (see module docstring)."""
    with open(path, "rb") as f:
        content = f.read()
    lines = content.split(b"\n")
    last_ts: float | None = None
    for i, line in enumerate(lines):
        is_last = i == len(lines) - 1
        if is_last and line == b"":
            break  # the file ended with "\n"
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
