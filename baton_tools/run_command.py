"""``baton run``: one turn of a coding session from the command line.

Starts a run of a coding agent on a thread (by default ``claude-code``), with a repository
as its workspace on the thread's first turn, streams what the agent says and does, and
prints how to continue the thread. A thread's next turn continues in the same workspace and
resumes the agent's session (docs/api.md, "Workspaces").
"""
from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import httpx
from rich.console import Console
from rich.text import Text

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def body_for(prompt: str, *, thread: str, agent: str, repo: str | None, ref: str | None, directory: str | None,
             credential: str | None, setup: list[str], history: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``POST /api/chat`` body of one turn (pure).

    Args:
        prompt: the user's message.
        thread: the thread id.
        agent: the agent kind.
        repo, ref, directory, credential, setup: the workspace (a thread's first turn only);
            ``repo`` and ``directory`` exclusive.
        history: the thread's saved messages (sent before the new one, as a chat client does).

    Raises:
        ValueError: both ``repo`` and ``directory``, or workspace options without either.
    """
    if repo and directory:
        raise ValueError("give --repo or --dir, not both")
    if (ref or credential or setup) and not (repo or directory):
        raise ValueError("--ref, --credential and --setup go with --repo (or --dir for --setup)")
    body: dict[str, Any] = {
        "threadId": thread, "agent": {"kind": agent},
        "messages": [*history, {"id": f"u-{uuid.uuid4().hex[:12]}", "role": "user", "content": prompt}],
    }
    if repo or directory:
        ws: dict[str, Any] = {"git": repo} if repo else {"dir": directory}
        if ref:
            ws["ref"] = ref
        if credential:
            ws["credential"] = credential
        if setup:
            ws["setup"] = list(setup)
        body["workspace"] = ws
    return body


def describe(chunk: dict[str, Any]) -> Text | None:
    """A line for a chunk a person wants to see (tool calls, results, errors), else ``None``."""
    t = chunk.get("type")
    if t == "TOOL_CALL_START":
        return Text(f"\n▸ {chunk.get('toolCallName', 'tool')}", style="cyan")
    if t == "TOOL_CALL_RESULT":
        content = str(chunk.get("content", ""))
        short = content if len(content) <= 400 else content[:400] + "…"
        return Text(short, style="dim")
    if t == "RUN_ERROR":
        return Text(f"\nerror: {chunk.get('message', '')}", style="red")
    return None


def run_turn(base: str, api_key: str | None, prompt: str, *, thread: str | None, agent: str, repo: str | None,
             ref: str | None, directory: str | None, credential: str | None, setup: list[str],
             as_json: bool) -> int:
    """Start one turn, stream it to the terminal; the exit status (0: completed)."""
    thread = thread or f"cli-{uuid.uuid4().hex[:12]}"
    run_id = f"run-{uuid.uuid4().hex[:16]}"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    status = "unknown"
    with httpx.Client(trust_env=False, timeout=httpx.Timeout(10.0, read=None), headers=headers) as http:
        saved = http.get(f"{base}/api/threads/{thread}/messages")
        history = saved.json().get("messages", []) if saved.status_code == 200 else []
        body = body_for(prompt, thread=thread, agent=agent, repo=repo, ref=ref, directory=directory,
                        credential=credential, setup=setup, history=history)
        with http.stream("POST", f"{base}/api/chat", params={"runId": run_id}, json=body,
                         headers={"Accept": "application/x-ndjson", "X-Run-Id": run_id}) as resp:
            if resp.status_code != 200:
                resp.read()
                try:
                    detail = resp.json().get("error", resp.text)
                except ValueError:
                    detail = resp.text
                err.print(Text(f"error: {resp.status_code}: {detail}", style="red"))
                return 2
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                chunk = json.loads(line).get("chunk", {})
                if as_json:
                    print(json.dumps(chunk, ensure_ascii=False), flush=True)
                elif chunk.get("type") == "TEXT_MESSAGE_CONTENT":
                    console.print(Text(str(chunk.get("delta", ""))), end="")
                else:
                    shown = describe(chunk)
                    if shown is not None:
                        console.print(shown)
                if chunk.get("type") == "RUN_FINISHED":
                    status = "completed"
                elif chunk.get("type") == "RUN_ERROR":
                    status = "failed"
    if not as_json:
        console.print()
        console.print(Text(f"{status}: run {run_id} on thread {thread}", style="bold"))
        console.print(Text(f"continue it: baton run --thread {thread} \"…\"", style="dim"))
    return 0 if status == "completed" else 1


def read_prompt(prompt: str | None) -> str:
    """The prompt argument, or stdin when it is ``-`` or absent (and stdin is not a terminal)."""
    if prompt and prompt != "-":
        return prompt
    if sys.stdin.isatty() and prompt is None:
        raise ValueError("give the prompt as an argument (or on stdin with -)")
    return sys.stdin.read()
