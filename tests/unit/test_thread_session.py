"""Where a thread's run starts (plan_turn) and the restored tree made ready for its agent."""
from __future__ import annotations

import io
import json
import tarfile

import pytest

from baton.errors import InvalidArgument, UnknownThread
from baton.log._transcript_fence import TranscriptWriter
from baton.workspaces import ThreadHead
from baton.workspaces.heads import ForkedFrom, TurnRecord
from sandbox_host.agents.sessions import claude_project_dir_name
from sandbox_host.thread_session import ResumeUnavailable, TurnStart, plan_turn, prepare_tree, turn_session

pytestmark = pytest.mark.unit

WS = {"git": "https://example.com/r.git", "ref": "main"}
W = TranscriptWriter("r1", 1, 10.0)


def head(**kw: object) -> ThreadHead:
    base: dict[str, object] = dict(workspace=WS, agent_kind="claude-code", agent_session_id="s1", snapshot="d1",
                                   turns={"r1": TurnRecord("d1", "s1", 2, 10.0)}, writer=W, tenant="acme")
    base.update(kw)
    return ThreadHead(**base)  # type: ignore[arg-type]


def plan(h: ThreadHead | None, **kw: object) -> TurnStart:
    args: dict[str, object] = dict(thread_id="t", agent_kind="claude-code", tenant="acme", workspace=None,
                                   new_session_id=lambda: "11111111-1111-4111-8111-111111111111")
    args.update(kw)
    return plan_turn(h, **args)  # type: ignore[arg-type]


def test_first_run_starts_from_the_requested_workspace() -> None:
    assert plan(None, workspace=WS) == TurnStart(workspace=WS)
    assert plan(None) == TurnStart()


def test_next_run_restores_the_snapshot_and_resumes_the_session() -> None:
    assert plan(head()) == TurnStart(workspace=WS, snapshot="d1", resume="s1")
    assert plan(head(), workspace=WS) == TurnStart(workspace=WS, snapshot="d1", resume="s1")


def test_another_agent_kind_keeps_the_workspace_not_the_session() -> None:
    assert plan(head(), agent_kind="codex") == TurnStart(workspace=WS, snapshot="d1", resume=None)


def test_another_tenant_sees_no_thread() -> None:
    with pytest.raises(UnknownThread):
        plan(head(), tenant="other")


def test_another_workspace_on_a_thread_is_refused() -> None:
    with pytest.raises(InvalidArgument) as e:
        plan(head(), workspace={"git": "https://example.com/other.git"})
    assert e.value.field == "workspace"


def test_first_run_of_a_fork() -> None:
    forked = head(turns={}, forked_from=ForkedFrom("src", "r1"))
    assert plan(forked) == TurnStart(workspace=WS, snapshot="d1", resume="s1", fork=True)
    assert plan(forked.__class__(**{**forked.__dict__, "agent_kind": "codex"}), agent_kind="codex") == TurnStart(
        workspace=WS, snapshot="d1", resume="11111111-1111-4111-8111-111111111111", fork_of="s1")
    # Its later runs resume its own session.
    assert plan(head(forked_from=ForkedFrom("src", "r1"))).fork is False


def test_turn_session() -> None:
    assert turn_session(TurnStart(resume="s1"), "s2") == "s2"
    assert turn_session(TurnStart(resume="s1"), None) == "s1"
    assert turn_session(TurnStart(resume="s1", fork=True), None) is None


def test_turn_start_round_trips() -> None:
    t = TurnStart(workspace=WS, snapshot="d", resume="s", fork=True, fork_of=None)
    assert TurnStart.from_json(t.to_json()) == t
    assert TurnStart.from_json("") is None


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def names(tar: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
        return {i.name: (tf.extractfile(i).read() if i.isfile() else b"") for i in tf}  # type: ignore[union-attr]


def test_claude_session_moves_to_this_sandbox_working_directory() -> None:
    old = claude_project_dir_name("/data/a/threads/t/work")
    tar = tar_of({"work/x.txt": b"x", f"home/.claude/projects/{old}/s1.jsonl": b"{}\n"})
    out = names(prepare_tree(tar, agent_kind="claude-code", workdir="/workspace", turn=TurnStart(resume="s1")))
    assert out == {"work/x.txt": b"x", f"home/.claude/projects/{claude_project_dir_name('/workspace')}/s1.jsonl": b"{}\n"}
    # Already there: unchanged bytes.
    same = tar_of({f"home/.claude/projects/{claude_project_dir_name('/workspace')}/s1.jsonl": b"{}\n"})
    assert prepare_tree(same, agent_kind="claude-code", workdir="/workspace", turn=TurnStart(resume="s1")) == same


def test_a_session_missing_from_the_tree_is_refused_before_launch() -> None:
    tar = tar_of({"work/x.txt": b"x"})
    with pytest.raises(ResumeUnavailable):
        prepare_tree(tar, agent_kind="claude-code", workdir="/w", turn=TurnStart(resume="s1"))
    with pytest.raises(ResumeUnavailable):
        prepare_tree(tar, agent_kind="codex", workdir="/w", turn=TurnStart(resume="s1"))
    # Nothing to resume: the tree as it is.
    assert prepare_tree(tar, agent_kind="codex", workdir="/w", turn=TurnStart()) == tar


def test_codex_fork_copies_the_rollout_under_the_new_id() -> None:
    src = "0199a213-81c0-7800-8aa1-bbab2a035a53"
    new = "11111111-1111-4111-8111-111111111111"
    meta = json.dumps({"type": "session_meta", "payload": {"id": src, "cwd": "/w"}}).encode() + b"\n"
    name = f"home/.codex/sessions/2026/12/03/rollout-2026-12-03T08-00-00-{src}.jsonl"
    tar = tar_of({name: meta + b'{"type":"response_item"}\n'})
    out = names(prepare_tree(tar, agent_kind="codex", workdir="/w", turn=TurnStart(resume=new, fork_of=src)))
    copy = name.replace(src, new)
    assert set(out) == {name, copy}
    assert out[name] == meta + b'{"type":"response_item"}\n'
    first = json.loads(out[copy].splitlines()[0])
    assert first["payload"]["id"] == new


def test_a_fork_head_keeps_its_source_and_how_many_messages_it_started_with() -> None:
    from baton.workspaces.heads import forked

    f = forked(head(), source_thread="src", run_id="r1", writer=W, now=20.0)
    assert f.forked_from == ForkedFrom("src", "r1", 2)  # r1's turn record: 2 messages
    assert ThreadHead.decode(f.encode()).forked_from == ForkedFrom("src", "r1", 2)
    # A head saved before the count was kept reads as 0.
    old = json.loads(f.encode())
    del old["forked_from"]["messages"]
    assert ThreadHead.decode(json.dumps(old).encode()).forked_from == ForkedFrom("src", "r1", 0)
