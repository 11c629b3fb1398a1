"""A live agent's inbox with the local provider (docs/hitl.md): approvals and a steered
message reach the stand-in claude once, through the launch wrapper's relay."""
from __future__ import annotations

import os
import pathlib

import pytest

from baton_tools.standins import STANDINS_DIR
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers.local import LocalProvider
from tests.conftest import unique
from tests.sandbox import relay_support as rs

pytestmark = pytest.mark.servers  # spawns the stand-in


@pytest.fixture
async def sandbox(local_provider: LocalProvider, sandboxes: list[SandboxHandle], tmp_path: pathlib.Path
                  ) -> tuple[SandboxHandle, dict[str, str]]:
    handle = await local_provider.create(unique("relay-"), SandboxSpec())
    sandboxes.append(handle)
    (tmp_path / "home").mkdir()
    return handle, {"PATH": f"{STANDINS_DIR}:{os.environ['PATH']}", "HOME": str(tmp_path / "home")}


async def _read(handle: SandboxHandle, rel: str) -> bytes:
    return (pathlib.Path(handle.workdir) / rel).read_bytes()


async def test_an_approval_reaches_the_agent_once(local_provider: LocalProvider, sandbox) -> None:  # type: ignore[no-untyped-def]
    await rs.approve_once_delivered_once(local_provider, sandbox[0], sandbox[1], _read)


async def test_a_denial_and_a_steered_message(local_provider: LocalProvider, sandbox) -> None:  # type: ignore[no-untyped-def]
    await rs.deny_then_steer(local_provider, sandbox[0], sandbox[1], _read)


async def test_bad_inputs_are_refused_before_the_inbox(local_provider: LocalProvider, sandbox) -> None:  # type: ignore[no-untyped-def]
    live = await rs.launch(local_provider, sandbox[0], "say hi", sandbox[1])
    try:
        for bad_id, payload in (("two words", b"{}"), ("", b"{}"), ("ok", b"{\n}"), ("ok", b""),
                                ("ok", b"x" * (200 * 1024))):
            with pytest.raises(ValueError):
                await local_provider.send_input(live.handle, bad_id, payload)
        assert pathlib.Path(live.handle.inbox_path).read_bytes() == b""
        await live.until(lambda o: o.get("type") == "result")
        await local_provider.send_input(live.handle, "eof", b"{}")
        assert (await live.to_end()).code == 0
    finally:
        await live.close()
    with pytest.raises(ValueError, match="without an inbox"):
        await local_provider.send_input(sandbox[0], "x", b"{}")


async def test_a_large_steer_is_one_journal_line(local_provider: LocalProvider, sandbox) -> None:  # type: ignore[no-untyped-def]
    """A 60 KB message is echoed into the journal whole (one write, not split where the
    agent's own lines could land between its pieces), and reaches the agent."""
    from sandbox_host.run_inputs import steer_payload

    live = await rs.launch(local_provider, sandbox[0], "say first\nsleep 1\nsay second", sandbox[1])
    big = "say " + "y" * 60000
    try:
        await live.until(lambda o: o.get("type") == "assistant")
        await local_provider.send_input(live.handle, "big-1", steer_payload(big))
        await live.until(lambda o: o.get("type") == "result")
        await local_provider.send_input(live.handle, "eof", b"{}")
        assert (await live.to_end()).code == 0
    finally:
        await live.close()
    [echo] = [o for o in live.lines if o.get("type") == "baton_input"]
    assert echo["id"] == "big-1" and echo["input"]["message"]["content"] == big
    said = [b["text"] for o in live.lines if o.get("type") == "assistant" for b in o["message"]["content"]
            if b.get("type") == "text"]
    assert "y" * 60000 in said


async def test_an_answer_too_large_for_the_inbox_is_a_denial_not_a_hang(local_provider: LocalProvider,
                                                                        sandbox) -> None:  # type: ignore[no-untyped-def]
    """The host's delivery (``run_inputs_io._deliver``): an allow whose payload the inbox refuses
    (too large once escaped) reaches the agent as a denial; the run goes on and ends."""
    from sandbox_host.providers import Sandbox
    from sandbox_host.run_inputs import Deliver, answer_payload
    from sandbox_host.run_inputs_io import UNDELIVERABLE, _deliver

    live = await rs.launch(local_provider, sandbox[0], "run echo hi", sandbox[1])
    try:
        ask = await live.until(rs.is_ask)
        rid = ask["request_id"]
        huge = answer_payload(rid, "allow", "", {"command": "echo " + "\x01" * 40000})
        await _deliver(Sandbox(local_provider, live.handle, live.nonce), "run-x", Deliver(rid, huge))
        result = await live.until(lambda o: o.get("type") == "result")
        await local_provider.send_input(live.handle, "eof", b"{}")
        assert (await live.to_end()).code == 0
    finally:
        await live.close()
    assert [d["tool_name"] for d in result["permission_denials"]] == ["Bash"]
    denied = [o for o in live.lines if o.get("type") == "user" and isinstance(o["message"]["content"], list)]
    assert denied[0]["message"]["content"][0]["content"] == UNDELIVERABLE


@pytest.mark.parametrize("kind", ["fifo", "directory"])
async def test_an_inbox_the_agent_made_a_fifo_refuses_its_inputs_for_good_not_each_pause(
        local_provider: LocalProvider, sandbox, caplog: pytest.LogCaptureFixture, kind: str) -> None:  # type: ignore[no-untyped-def]
    """An agent that put a FIFO or a directory where its inbox was gets no input, and the host's delivery
    (``run_inputs_io._deliver``) gives the input up at once, logged, as one too large: it is
    not tried again every pause for the rest of the run. An approval's answer too (its
    denial cannot go through either)."""
    import asyncio
    import logging
    import os

    from sandbox_host.providers import Sandbox
    from sandbox_host.run_inputs import Deliver, answer_payload, steer_payload
    from sandbox_host.run_inputs_io import _deliver

    live = await rs.launch(local_provider, sandbox[0], "sleep 30", sandbox[1])
    try:
        inbox = live.handle.inbox_path
        os.unlink(inbox)
        os.mkfifo(inbox) if kind == "fifo" else os.mkdir(inbox)
        sbx = Sandbox(local_provider, live.handle, live.nonce)
        with caplog.at_level(logging.ERROR, logger="baton.sandbox_host.inputs"):
            async with asyncio.timeout(30):
                await _deliver(sbx, "run-x", Deliver("steer-1", steer_payload("hello")))
                await _deliver(sbx, "run-x", Deliver("ask-1", answer_payload("ask-1", "allow", "", {"command": "ls"})))
        refused = [r.getMessage() for r in caplog.records]
        assert any("input steer-1 cannot be delivered" in m and "not a regular file" in m for m in refused)
        assert any("approval ask-1: not even a denial can be delivered" in m for m in refused)
        assert os.path.exists(inbox) and not os.path.isfile(inbox)  # nothing written in its place
    finally:
        await live.close()


async def test_a_relaunched_agent_takes_the_answer_its_predecessor_waited_for(
        local_provider: LocalProvider, sandbox) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    async def kill_agent(h: SandboxHandle) -> None:
        proc = await asyncio.create_subprocess_exec("sh", "-c", rs.KILL_AGENT, "sh", h.journal_path)
        assert await proc.wait() == 0

    await rs.relaunched_process_gets_the_answer(local_provider, sandbox[0], sandbox[1], _read, kill_agent)
