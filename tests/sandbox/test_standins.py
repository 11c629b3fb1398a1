"""The stand-in ``claude`` and ``codex`` run through baton's real launch path.

A thread's turns in one workspace: ``prepare_agent(...).argv`` launched by the local
provider (stand-ins first on ``PATH`` through the sandbox env, ``HOME`` a temp dir so the
session stores are the test's own), the journal followed, every line fed to the real
translator. A resumed turn sees the earlier prompts (``recall``), a fork gets a new id and
leaves its source untouched, an unknown session is refused and ``resume_refused`` names it.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
from dataclasses import dataclass
from typing import Any

import pytest

from baton_tools.standins import STANDINS, STANDINS_DIR
from sandbox_host.agents import AgentLaunch, prepare_agent
from sandbox_host.agents.sessions import agent_session_id, claude_session_path, fork_codex_rollout, resume_refused
from sandbox_host.journal import JournalExit, JournalLine, new_nonce
from sandbox_host.providers import SandboxHandle, SandboxSpec
from sandbox_host.providers.local import LocalProvider
from sandbox_host.translate import Chunk, translate_lines, translator_for
from tests.sandbox.conftest import follow_all, with_data

pytestmark = pytest.mark.servers  # spawns the stand-ins

DATA = pathlib.Path(__file__).resolve().parents[1] / "unit" / "data" / "standins"
UNKNOWN = "3f2b8c1e-7d4a-4c55-9b1e-2a6f0c9d8e71"


@dataclass
class Turn:
    lines: list[bytes]
    exit_code: int
    stderr: bytes
    chunks: list[Chunk]

    @property
    def session_id(self) -> str | None:
        fmt = "claude-stream-json" if self.lines and b'"system"' in self.lines[0] else "codex-exec-json"
        return agent_session_id(fmt, self.lines[0]) if self.lines else None

    def types(self) -> list[str]:
        """Chunk types without CUSTOM (notices whose count is no part of the contract here)."""
        return [c["type"] for c in self.chunks if c["type"] != "CUSTOM"]

    def text(self) -> str:
        return "".join(c["delta"] for c in self.chunks if c["type"] == "TEXT_MESSAGE_CONTENT")


class Thread:
    """One workspace whose turns launch one after the other, as a coding thread does."""

    def __init__(self, provider: LocalProvider, handle: SandboxHandle, sandboxes: list[SandboxHandle],
                 home: pathlib.Path) -> None:
        self.provider, self.handle, self.sandboxes, self.home = provider, handle, sandboxes, home
        self.env = {"PATH": f"{STANDINS_DIR}:{os.environ['PATH']}", "HOME": str(home)}
        self.runs = 0

    async def turn(self, launch: AgentLaunch) -> Turn:
        self.runs += 1
        nonce = new_nonce()
        offset = os.path.getsize(self.handle.journal_path) if os.path.exists(self.handle.journal_path) else 0
        err_offset = os.path.getsize(self.handle.stderr_path) if os.path.exists(self.handle.stderr_path) else 0
        data = await self.provider.launch(self.handle, launch.argv, nonce=nonce, stdin=launch.stdin,
                                          env={**launch.env, **self.env})
        self.handle = with_data(self.handle, dict(data))
        self.sandboxes[-1] = self.handle
        items = await follow_all(self.provider, self.handle, nonce, offset=offset)
        assert isinstance(items[-1], JournalExit), items[-1]
        lines = [i.data for i in items if isinstance(i, JournalLine)]
        tr = translator_for(launch.journal_format, f"run-{self.runs}", "thread-1")
        chunks = translate_lines(tr, lines) + tr.finish(items[-1].code)
        stderr = pathlib.Path(self.handle.stderr_path).read_bytes()[err_offset:]
        assert not [c for c in chunks if c["type"] == "CUSTOM" and str(c["name"]).startswith("journal.")], chunks
        return Turn(lines, items[-1].code, stderr, chunks)

    @property
    def workdir(self) -> pathlib.Path:
        return pathlib.Path(os.path.realpath(self.handle.workdir))


@pytest.fixture
async def thread(local_provider: LocalProvider, sandboxes: list[SandboxHandle], tmp_path: pathlib.Path) -> Thread:
    handle = await local_provider.create("standin-thread", SandboxSpec())
    sandboxes.append(handle)
    (tmp_path / "home").mkdir()
    return Thread(local_provider, handle, sandboxes, tmp_path / "home")


TOOL_CALL = ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
TEXT = ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]


async def test_claude_turns_resume_and_fork(thread: Thread) -> None:
    first = "write notes.txt hello\nrun cat notes.txt\nsay first turn"
    t1 = await thread.turn(prepare_agent("claude-code", {}, prompt=first))
    assert t1.exit_code == 0 and t1.stderr == b""
    # Partial messages (the kind's default): ARGS arrive in pieces; the snapshot is not doubled.
    types = t1.types()
    assert types[0] == "RUN_STARTED" and types[1] == "STEP_STARTED" and types[-2:] == ["STEP_FINISHED", "RUN_FINISHED"]
    calls = [c for c in t1.chunks if c["type"] == "TOOL_CALL_START"]
    assert [c["toolCallName"] for c in calls] == ["Write", "Bash"]
    results = [c["content"] for c in t1.chunks if c["type"] == "TOOL_CALL_RESULT"]
    assert results == [f"File created successfully at: {thread.workdir}/notes.txt", "hello"]
    assert types.count("TEXT_MESSAGE_START") == 2 and t1.text() == "first turn(stand-in) Done: 3 step(s)."
    assert (thread.workdir / "notes.txt").read_text() == "hello\n"
    sid = t1.session_id
    assert sid is not None
    store = pathlib.Path(claude_session_path(str(thread.home / ".claude"), str(thread.workdir), sid))
    stored = [json.loads(ln) for ln in store.read_text().splitlines()]
    assert stored[0]["type"] == "user" and stored[0]["message"] == {"role": "user", "content": first}
    assert {e["sessionId"] for e in stored} == {sid}

    t2 = await thread.turn(prepare_agent("claude-code", {"partial_messages": False}, prompt="recall",
                                         resume=sid))
    assert t2.exit_code == 0 and t2.session_id == sid
    assert t2.text() == f"Previous prompts in this session:\n1. {first}(stand-in) Done: 1 step(s)."
    assert t2.types() == ["RUN_STARTED", "STEP_STARTED", *TEXT, *TEXT, "STEP_FINISHED", "RUN_FINISHED"]
    assert resume_refused("claude-stream-json", t2.lines, t2.exit_code, t2.stderr, resume_id=sid) is None

    before = store.read_bytes()
    t3 = await thread.turn(prepare_agent("claude-code", {}, prompt="append notes.txt more\nrecall",
                                         resume=sid, fork=True))
    forked = t3.session_id
    assert t3.exit_code == 0 and forked not in (None, sid)
    assert "1. " + first in t3.text() and "2. recall" in t3.text()
    assert store.read_bytes() == before  # the source session is left as it was
    fork_store = store.with_name(f"{forked}.jsonl")
    assert {json.loads(ln)["sessionId"] for ln in fork_store.read_text().splitlines()} == {forked}
    assert (thread.workdir / "notes.txt").read_text() == "hello\nmore\n"
    assert resume_refused("claude-stream-json", t3.lines, 0, t3.stderr, resume_id=sid, fork=True) is None

    t4 = await thread.turn(prepare_agent("claude-code", {}, prompt="recall", resume=UNKNOWN))
    assert t4.exit_code == 1
    assert t4.stderr == f"No conversation found with session ID: {UNKNOWN}\n".encode()
    reason = resume_refused("claude-stream-json", t4.lines, t4.exit_code, t4.stderr, resume_id=UNKNOWN)
    assert reason == f"claude has no session {UNKNOWN} to resume: No conversation found with session ID: {UNKNOWN}"
    assert t4.chunks[-1]["type"] == "RUN_ERROR" and UNKNOWN in t4.chunks[-1]["message"]


async def test_codex_turns_resume_and_fork_by_copy(thread: Thread) -> None:
    first = "write src/a.py print(1)\nrun python3 src/a.py\nhello there"
    t1 = await thread.turn(prepare_agent("codex", {}, prompt=first))
    assert t1.exit_code == 0
    assert t1.types() == ["RUN_STARTED", "STEP_STARTED", *TOOL_CALL, *TOOL_CALL, *TEXT, "STEP_FINISHED",
                          "RUN_FINISHED"]
    calls = [c["toolCallName"] for c in t1.chunks if c["type"] == "TOOL_CALL_START"]
    assert calls == ["apply_patch", "shell"]
    assert [c["content"] for c in t1.chunks if c["type"] == "TOOL_CALL_RESULT"][1] == "1\n"
    assert t1.text() == "(stand-in) You said: hello there"
    assert (thread.workdir / "src" / "a.py").read_text() == "print(1)\n"
    tid = t1.session_id
    assert tid is not None
    rollouts = list((thread.home / ".codex" / "sessions").glob(f"*/*/*/rollout-*-{tid}.jsonl"))
    assert len(rollouts) == 1
    assert json.loads(rollouts[0].read_text().splitlines()[0])["payload"]["id"] == tid

    t2 = await thread.turn(prepare_agent("codex", {}, prompt="recall", resume=tid))
    assert t2.exit_code == 0 and t2.session_id == tid
    assert t2.text().startswith(f"Previous prompts in this session:\n1. {first}")
    assert resume_refused("codex-exec-json", t2.lines, 0, t2.stderr, resume_id=tid) is None

    # Fork: copy the rollout under a new id, resume the copy; the source stays as it was.
    source = rollouts[0]
    before = source.read_bytes()
    new_id = "0199f111-0419-7000-8000-0000000f0123"
    copy = source.with_name(source.name.replace(tid, new_id))
    copy.write_bytes(fork_codex_rollout(before, new_id))
    t3 = await thread.turn(prepare_agent("codex", {}, prompt="say forked\nrecall", resume=new_id))
    assert t3.exit_code == 0 and t3.session_id == new_id
    assert f"1. {first}" in t3.text() and "2. recall" in t3.text()
    assert source.read_bytes() == before

    t4 = await thread.turn(prepare_agent("codex", {}, prompt="recall", resume=UNKNOWN))
    assert t4.exit_code == 1 and t4.lines == []
    reason = resume_refused("codex-exec-json", t4.lines, t4.exit_code, t4.stderr, resume_id=UNKNOWN)
    assert reason is not None and UNKNOWN in reason and "no rollout found" in reason
    assert t4.chunks[-1]["type"] == "RUN_ERROR"


async def test_failures_and_sleep(thread: Thread) -> None:
    c = await thread.turn(prepare_agent("claude-code", {}, prompt="write x.txt 1\nfail out of budget\nwrite y.txt 2"))
    assert c.exit_code == 1 and c.chunks[-1]["type"] == "RUN_ERROR" and c.chunks[-1]["message"] == "out of budget"
    assert (thread.workdir / "x.txt").exists() and not (thread.workdir / "y.txt").exists()
    x = await thread.turn(prepare_agent("codex", {}, prompt="sleep 0.2\nfail boom"))
    assert x.exit_code == 1 and x.chunks[-1] == {**x.chunks[-1], "type": "RUN_ERROR", "message": "boom"}


def run_standin(name: str, args: list[str], stdin: str, cwd: pathlib.Path, home: pathlib.Path
                ) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    return subprocess.run([STANDINS[name], *args], input=stdin.encode(), cwd=cwd, env=env, capture_output=True,
                          timeout=30, check=False)


def test_standins_refuse_what_the_real_clis_refuse(tmp_path: pathlib.Path) -> None:
    def claude(*args: str) -> subprocess.CompletedProcess[bytes]:
        return run_standin("claude", list(args), "hi", tmp_path, tmp_path)

    def codex(*args: str) -> subprocess.CompletedProcess[bytes]:
        return run_standin("codex", list(args), "hi", tmp_path, tmp_path)

    bad = claude("-p", "--output-format", "stream-json", "--verbose", "--bogus")
    assert bad.returncode == 1 and bad.stderr == b"error: unknown option '--bogus'\n"
    noverbose = claude("-p", "--output-format", "stream-json")
    assert noverbose.returncode == 1 and b"requires --verbose" in noverbose.stderr
    assert claude("-p", "--session-id", "nope").returncode == 1
    text = claude("-p")
    assert text.returncode == 0 and text.stdout == b"(stand-in) You said: hi\n"
    # Only global options may follow `resume` (clap): --sandbox may not.
    late = codex("exec", "--json", "resume", UNKNOWN, "--sandbox", "read-only", "-")
    assert late.returncode == 2 and b"unexpected argument '--sandbox' found" in late.stderr
    assert codex("exec", "--json", "--bogus", "-").returncode == 2
    untrusted = codex("exec", "--json", "-")
    assert untrusted.returncode == 1 and b"--skip-git-repo-check was not specified" in untrusted.stderr
    # The refusals the unit tests read were captured from these programs; they still print them.
    refusal = run_standin("claude", ["-p", "--output-format", "stream-json", "--verbose", "--resume", UNKNOWN],
                          "recall", tmp_path, tmp_path)
    captured: dict[str, Any] = json.loads((DATA / "claude-unknown-resume.stdout").read_bytes())
    assert refusal.returncode == 1 and refusal.stderr == (DATA / "claude-unknown-resume.stderr").read_bytes()
    assert json.loads(refusal.stdout) == {**captured, "uuid": json.loads(refusal.stdout)["uuid"]}
    x = run_standin("codex", ["exec", "--json", "--skip-git-repo-check", "resume",
                              "0199f000-0419-7000-8000-00000000c0de", "-"], "recall", tmp_path, tmp_path)
    assert (x.returncode, x.stdout, x.stderr) == (1, b"", (DATA / "codex-unknown-resume.stderr").read_bytes())
