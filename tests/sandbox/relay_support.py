"""Scenarios of a live agent's inbox (docs/hitl.md), shared by the local and docker providers:
the stand-in ``claude`` asks for a tool's permission over its stream-json control protocol,
the host appends the answer to the sandbox's inbox, and the launch wrapper's relay passes it
to the agent once, writing it into the journal first."""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator, Mapping

from sandbox_host.agents import prepare_agent
from sandbox_host.journal import JournalExit, JournalItem, JournalLine, follow_journal, new_nonce
from sandbox_host.providers import Provider, SandboxHandle
from sandbox_host.run_inputs import EOF_ID, answer_payload, steer_payload


class Live:
    """One interactive launch, its journal read as it grows."""

    def __init__(self, provider: Provider, handle: SandboxHandle, nonce: str) -> None:
        self.provider, self.handle, self.nonce = provider, handle, nonce
        self.lines: list[dict[str, Any]] = []
        self.exit: JournalExit | None = None
        self._items: AsyncIterator[JournalItem] = follow_journal(
            provider, handle, handle.journal_path, offset=0, nonce=nonce, poll_interval=0.05)

    async def until(self, want: Any, timeout: float = 20.0) -> dict[str, Any]:
        """Read lines until one satisfies ``want`` (a predicate on the parsed line); returns it."""
        async with asyncio.timeout(timeout):
            async for item in self._items:
                if isinstance(item, JournalExit):
                    self.exit = item
                    raise AssertionError(f"the agent ended ({item.code}) first: {self.lines}")
                if isinstance(item, JournalLine):
                    obj = json.loads(item.data)
                    self.lines.append(obj)
                    if want(obj):
                        return obj
        raise AssertionError("journal ended")

    async def to_end(self, timeout: float = 20.0) -> JournalExit:
        async with asyncio.timeout(timeout):
            async for item in self._items:
                if isinstance(item, JournalExit):
                    self.exit = item
                    return item
                if isinstance(item, JournalLine):
                    self.lines.append(json.loads(item.data))
        raise AssertionError("journal ended without its sentinel")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._items.aclose()  # type: ignore[attr-defined]

    def types(self) -> list[str]:
        return [str(o.get("type")) for o in self.lines]


async def launch(provider: Provider, handle: SandboxHandle, prompt: str, env: Mapping[str, str],
                 options: Mapping[str, Any] | None = None) -> Live:
    """The stand-in claude launched as baton launches it (interactive, approvals on)."""
    spec = prepare_agent("claude-code", {"approvals": True, **(options or {})}, prompt=prompt)
    assert spec.interactive and "--permission-prompt-tool" in spec.argv
    nonce = new_nonce()
    data = await provider.launch(handle, spec.argv, nonce=nonce, stdin=spec.stdin, env={**spec.env, **env},
                                 interactive=True)
    handle = SandboxHandle(handle.provider, handle.key, handle.journal_path, handle.stderr_path, handle.workdir,
                           {**handle.data, **data})
    assert handle.inbox_path
    return Live(provider, handle, nonce)


def is_ask(obj: dict[str, Any]) -> bool:
    return obj.get("type") == "control_request"


async def approve_once_delivered_once(provider: Provider, handle: SandboxHandle, env: Mapping[str, str],
                                      read: Any) -> None:
    """Allow a Bash call; the answer is appended twice (as a host and its successor might):
    the journal shows it once, before the tool's result; the command ran; ``eof`` ends the agent.

    ``read(handle, path) -> bytes``: a file of the sandbox's workspace."""
    live = await launch(provider, handle, "run echo approved > a.txt\nsay after", env)
    try:
        ask = await live.until(is_ask)
        rid = ask["request_id"]
        assert ask["request"]["tool_name"] == "Bash" and ask["request"]["input"]["command"] == "echo approved > a.txt"
        assert not await _exists(read, live.handle, "a.txt")  # nothing ran before the answer
        payload = answer_payload(rid, "allow", "", ask["request"]["input"])
        await provider.send_input(live.handle, rid, payload)
        await provider.send_input(live.handle, rid, payload)
        await live.until(lambda o: o.get("type") == "result")
        await provider.send_input(live.handle, EOF_ID, b"{}")
        end = await live.to_end()
        assert end.code == 0
        echoes = [o for o in live.lines if o.get("type") == "baton_input"]
        assert [(e["id"], e["input"]["response"]["response"]["behavior"]) for e in echoes] == [(rid, "allow")]
        at_echo = live.lines.index(echoes[0])
        result_at = next(i for i, o in enumerate(live.lines)
                         if o.get("type") == "user" and o["message"]["content"][0].get("tool_use_id")
                         == ask["request"]["tool_use_id"])
        assert live.lines.index(ask) < at_echo < result_at
        assert live.lines[result_at]["message"]["content"][0].get("is_error") is not True
        assert await read(live.handle, "a.txt") == b"approved\n"
    finally:
        await live.close()


async def deny_then_steer(provider: Provider, handle: SandboxHandle, env: Mapping[str, str], read: Any) -> None:
    """Deny a Write (error result, listed in ``permission_denials``, no file); a message steered
    in during the turn is taken into it (its command runs in the same turn)."""
    live = await launch(provider, handle, "write secret.txt no\nsleep 1\nsay first", env,
                        {"allowed_tools": ["Bash"]})
    try:
        ask = await live.until(is_ask)
        rid = ask["request_id"]
        assert ask["request"]["tool_name"] == "Write"
        await provider.send_input(live.handle, rid, answer_payload(rid, "deny", "not that file", None))
        await provider.send_input(live.handle, "msg-1", steer_payload("run echo steered > s.txt"))
        result = await live.until(lambda o: o.get("type") == "result")
        await provider.send_input(live.handle, EOF_ID, b"{}")
        assert (await live.to_end()).code == 0
        denied = [o for o in live.lines if o.get("type") == "user" and isinstance(o["message"]["content"], list)
                  and o["message"]["content"][0].get("is_error")]
        assert [d["message"]["content"][0]["content"] for d in denied] == ["not that file"]
        assert [d["tool_name"] for d in result["permission_denials"]] == ["Write"]
        assert not await _exists(read, live.handle, "secret.txt")
        assert await read(live.handle, "s.txt") == b"steered\n"  # Bash is allowed: no ask
        assert live.types().count("control_request") == 1
        steer_echo = next(o for o in live.lines if o.get("type") == "baton_input" and o["id"] == "msg-1")
        assert live.lines.index(steer_echo) < live.lines.index(result)
    finally:
        await live.close()


async def _exists(read: Any, handle: SandboxHandle, rel: str) -> bool:
    try:
        await read(handle, rel)
    except FileNotFoundError:
        return False
    return True


#: Kills the agent's own process (the stand-in's python3 writing the journal ``$1``), not its
#: wrapper: what a crash or an OOM kill of the agent does.
KILL_AGENT = ('for p in /proc/[0-9]*; do [ "$(readlink "$p/fd/1" 2>/dev/null)" = "$1" ] && '
              'grep -q python3 "$p/cmdline" 2>/dev/null && kill -9 "${p#/proc/}"; done; true')


async def relaunched_process_gets_the_answer(provider: Provider, handle: SandboxHandle, env: Mapping[str, str],
                                             read: Any, kill_agent: Any) -> None:
    """The agent dies while it waits; relaunched with ``--resume`` (the resume marker first,
    in the same journal, with its own inbox), it asks again for the same call, takes the
    answer under its new request id, and the command runs once.

    ``kill_agent(handle)``: runs :data:`KILL_AGENT` in the sandbox."""
    from sandbox_host.agents import RESUME_PROMPT
    from sandbox_host.journal import JournalResume, nonce_file_text

    live = await launch(provider, handle, "run echo once >> o.txt && cat o.txt", env)
    try:
        ask = await live.until(is_ask)
        session = next(o["session_id"] for o in live.lines if o.get("subtype") == "init")
        await kill_agent(live.handle)
        died = await live.to_end()
        assert died.code == 137
    finally:
        await live.close()
    spec = prepare_agent("claude-code", {"approvals": True}, prompt=RESUME_PROMPT, resume=session)
    data = await provider.launch(live.handle, spec.argv, nonce=nonce_file_text(live.nonce, 2), stdin=spec.stdin,
                                 env={**spec.env, **env}, interactive=True)
    h2 = SandboxHandle(handle.provider, handle.key, handle.journal_path, handle.stderr_path, handle.workdir,
                       {**live.handle.data, **data})
    again = Live(provider, h2, live.nonce)
    again._items = follow_journal(provider, h2, h2.journal_path, offset=died.end, nonce=live.nonce, poll_interval=0.05)
    try:
        first = await anext(again._items)  # type: ignore[arg-type]
        assert isinstance(first, JournalResume) and (first.attempt, first.inbox) == (2, h2.inbox_path)
        reask = await again.until(is_ask)
        assert reask["request"]["tool_use_id"] == ask["request"]["tool_use_id"]
        assert reask["request_id"] != ask["request_id"]
        rid = reask["request_id"]
        await provider.send_input(h2, rid, answer_payload(rid, "allow", "", reask["request"]["input"]))
        await again.until(lambda o: o.get("type") == "result")
        await provider.send_input(h2, EOF_ID, b"{}")
        assert (await again.to_end()).code == 0
        assert await read(h2, "o.txt") == b"once\n"
    finally:
        await again.close()
