"""The workspace store against a real nats-server: snapshot/restore, dedupe, heads, fork, gc."""
from __future__ import annotations

import asyncio
import io
import os
import pathlib
import tarfile
from typing import AsyncIterator

import pytest
from nats.aio.client import Client as NATS

from baton.errors import (LogUnavailable, SnapshotMissing, UnknownRun, UnknownThread, WorkspaceConflict,
                          WorkspaceFenced, WorkspaceTooLarge, WorkspaceUnsafe)
from baton.log import TranscriptWriter
from baton.workspaces import Excludes, WorkspaceConfig, WorkspaceStore
from baton_tools.testing.servers import NatsServer
from tests.conftest import unique
from tests.workspaces.test_pure import make_tar

pytestmark = pytest.mark.timeout(60)


def cfg(**kw: object) -> WorkspaceConfig:
    tag = unique("w")
    base: dict[str, object] = dict(objects=f"ws-{tag}", heads=f"heads-{tag}", timeout=5.0, pack_bytes=64 << 10)
    base.update(kw)
    return WorkspaceConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
async def nc(nats: NatsServer) -> AsyncIterator[NATS]:
    conn = await _connect(nats.url)
    yield conn
    await conn.close()


async def _connect(url: str) -> NATS:
    import nats as nats_mod
    return await nats_mod.connect(servers=[url], max_reconnect_attempts=-1, reconnect_time_wait=0.1)


@pytest.fixture
async def store(nc: NATS) -> AsyncIterator[WorkspaceStore]:
    s = WorkspaceStore(nc, cfg())
    await s.provision()
    yield s
    js = nc.jetstream()
    await js.delete_object_store(s.cfg.objects)
    await js.delete_key_value(s.cfg.heads)


def make_dir(root: pathlib.Path, files: int = 40) -> None:
    (root / "work/src").mkdir(parents=True)
    (root / "home/.claude").mkdir(parents=True)
    for i in range(files):
        (root / f"work/src/f{i}.py").write_text(f"print({i})\n" * (i + 1))
    (root / "work/blob.bin").write_bytes(os.urandom(200_000))
    (root / "work/run.sh").write_text("#!/bin/sh\n")
    (root / "work/run.sh").chmod(0o755)
    (root / "work/link").symlink_to("src/f1.py")
    (root / "home/.claude/.credentials.json").write_text("{\"token\": \"secret\"}")
    (root / "home/.claude/session.jsonl").write_text("{}\n")


def tar_dir(root: pathlib.Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for top in ("work", "home"):
            tar.add(root / top, arcname=top)
    return buf.getvalue()


def tree(root: pathlib.Path) -> dict[str, tuple[str, int, bytes]]:
    """path -> (kind, mode, content or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = pathlib.Path(dirpath) / n
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("l", 0, os.readlink(p).encode())
            elif p.is_dir():
                out[rel] = ("d", p.stat().st_mode & 0o7777, b"")
            else:
                out[rel] = ("f", p.stat().st_mode & 0o7777, p.read_bytes())
    return out


async def test_snapshot_restores_the_same_tree_and_a_one_file_turn_stores_that_file(
        store: WorkspaceStore, tmp_path: pathlib.Path) -> None:
    src = tmp_path / "src"
    make_dir(src)
    first = await store.snapshot(tar_dir(src))
    assert first.files == 43 and first.bytes_stored > 200_000
    out = tmp_path / "out"
    await store.restore_to_dir(first.digest, out)
    want = {k: v for k, v in tree(src).items() if k != "home/.claude/.credentials.json"}  # excluded by default
    assert tree(out) == want
    # The same tree again: only a manifest (it names its parent, so its digest differs).
    same = await store.snapshot(tar_dir(src), parent=first.digest)
    assert same.digest != first.digest and same.bytes_stored < 4_000
    assert (await store.snapshot(tar_dir(src))).digest == first.digest  # same tree, same parent
    (src / "work/src/f3.py").write_text("changed\n")
    second = await store.snapshot(tar_dir(src), parent=first.digest)
    assert second.digest != first.digest
    assert second.bytes_stored < 0.02 * first.bytes_stored + 2_000  # the file and the manifest
    out2 = tmp_path / "out2"
    await store.restore_to_dir(second.digest, out2)
    assert tree(out2)["work/src/f3.py"] == ("f", 0o644, b"changed\n")
    assert tree(out2) == {k: v for k, v in tree(src).items() if k != "home/.claude/.credentials.json"}
    # The tar form extracts to the same tree.
    blob = await store.restore_tar(second.digest)
    with tarfile.open(fileobj=io.BytesIO(blob)) as t:
        t.extractall(tmp_path / "out3", filter="tar")
    assert tree(tmp_path / "out3") == tree(out2)


async def test_limit_excludes_and_hostile_tars_store_nothing(nc: NATS, tmp_path: pathlib.Path) -> None:
    s = WorkspaceStore(nc, cfg(max_bytes=1000, excludes=Excludes(("*.log",))))
    await s.provision()
    with pytest.raises(WorkspaceTooLarge) as exc:
        await s.snapshot(make_tar([("work/a", "f", b"x" * 600), ("work/b", "f", b"y" * 600)]))
    assert (exc.value.limit, exc.value.size) == (1000, 1200)
    for bad in ([("/etc/passwd", "f", b"x")], [("work/../../x", "f", b"x")], [("work/l", "l", "."), ("work/l/x", "f", b"x")]):
        with pytest.raises(WorkspaceUnsafe):
            await s.snapshot(make_tar(bad))  # type: ignore[arg-type]
    obj = await nc.jetstream().object_store(s.cfg.objects)
    assert (await obj.status()).size == 0  # nothing stored
    info = await s.snapshot(make_tar([("work/a", "f", b"x" * 600), ("work/big.log", "f", b"z" * 5000),
                                      ("work/out", "l", "/etc/passwd")]))
    assert [p for p, _ in info.skipped] == ["work/out"]
    await s.restore_to_dir(info.digest, tmp_path / "r")
    assert sorted(tree(tmp_path / "r")) == ["work", "work/a"]
    await nc.jetstream().delete_object_store(s.cfg.objects)
    await nc.jetstream().delete_key_value(s.cfg.heads)


async def test_restore_of_a_missing_snapshot(store: WorkspaceStore, tmp_path: pathlib.Path) -> None:
    with pytest.raises(SnapshotMissing):
        await store.restore_to_dir("0" * 64, tmp_path / "x")


async def test_fenced_heads_fork_delete(store: WorkspaceStore) -> None:
    spec = {"repo": "https://example.invalid/r.git"}
    w1 = TranscriptWriter("r1", 1, 100.0)
    rev = await store.save_turn("t1", run_id="r1", snapshot="s1", agent_session_id="a1", messages=2,
                                workspace=spec, agent_kind="claude", writer=w1)
    # A successor of r1 (epoch 2) takes over and saves; r1 at epoch 1 is fenced out.
    await store.save_turn("t1", run_id="r1", snapshot="s1b", agent_session_id="a1", messages=3,
                          workspace=spec, agent_kind="claude", writer=TranscriptWriter("r1", 2, 100.0))
    with pytest.raises(WorkspaceFenced) as fenced:
        await store.save_turn("t1", run_id="r1", snapshot="zombie", agent_session_id="a1", messages=9,
                              workspace=spec, agent_kind="claude", writer=w1)
    assert (fenced.value.stored_run_id, fenced.value.stored_epoch) == ("r1", 2)
    # A later run wins; the earlier run can never overwrite it.
    await store.save_turn("t1", run_id="r2", snapshot="s2", agent_session_id="a2", messages=5,
                          workspace=spec, agent_kind="claude", writer=TranscriptWriter("r2", 1, 200.0))
    with pytest.raises(WorkspaceFenced):
        await store.save_turn("t1", run_id="r1", snapshot="late", agent_session_id="a1", messages=3,
                              workspace=spec, agent_kind="claude", writer=TranscriptWriter("r1", 2, 100.0))
    head, rev2 = await store.load_head("t1")
    assert head is not None and rev2 is not None and rev2 > rev
    assert (head.snapshot, head.agent_session_id, list(head.turns)) == ("s2", "a2", ["r1", "r2"])
    assert head.turns["r1"].snapshot == "s1b" and head.turns["r1"].messages == 3 and head.workspace == spec
    # Fork from r1's turn: the source is untouched.
    await store.fork("t1", "r1", "t2", TranscriptWriter("n1", 1, 300.0))
    f, _ = await store.load_head("t2")
    assert f is not None and (f.snapshot, f.agent_session_id) == ("s1b", "a1")
    assert f.forked_from is not None and (f.forked_from.thread_id, f.forked_from.run_id) == ("t1", "r1")
    assert (await store.load_head("t1"))[0] == head
    with pytest.raises(WorkspaceConflict):
        await store.fork("t1", "r1", "t2", TranscriptWriter("n1", 1, 300.0))
    with pytest.raises(UnknownRun):
        await store.fork("t1", "nope", "t3", TranscriptWriter("n1", 1, 300.0))
    with pytest.raises(UnknownThread):
        await store.fork("nope", "r1", "t3", TranscriptWriter("n1", 1, 300.0))
    await store.delete_thread("t1")
    assert await store.load_head("t1") == (None, None)
    await store.delete_thread("t1")  # idempotent
    # A deleted thread starts again from nothing.
    await store.save_turn("t1", run_id="r9", snapshot=None, agent_session_id=None, messages=0,
                          workspace={}, agent_kind="codex", writer=TranscriptWriter("r9", 1, 1.0))


async def test_gc_keeps_what_heads_reach_and_removes_the_rest(store: WorkspaceStore, nc: NATS) -> None:
    w = TranscriptWriter("r1", 1, 1.0)
    a = await store.snapshot(make_tar([("work/a", "f", os.urandom(3000)), ("work/shared", "f", b"s" * 5000)]))
    b = await store.snapshot(make_tar([("work/b", "f", os.urandom(3000)), ("work/shared", "f", b"s" * 5000)]), parent=a.digest)
    gone = await store.snapshot(make_tar([("work/g", "f", os.urandom(3000))]))
    await store.save_turn("keep", run_id="r1", snapshot=b.digest, agent_session_id=None, messages=1,
                          workspace={}, agent_kind="claude", writer=w)
    await store.save_turn("drop", run_id="r1", snapshot=gone.digest, agent_session_id=None, messages=1,
                          workspace={}, agent_kind="claude", writer=w)
    await store.delete_thread("drop")
    import time
    young = await store.gc(time.time(), grace=3600)  # everything is young: nothing goes
    assert young.snapshots_deleted == young.packs_deleted == 0
    report = await store.gc(time.time() + 7200, grace=3600)
    assert report.snapshots_deleted == 2  # a (no head names it) and gone
    assert report.packs_deleted >= 1
    await store.restore_to_dir(b.digest, pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / unique("gc"))
    for d in (a.digest, gone.digest):
        with pytest.raises(SnapshotMissing):
            await store.manifest(d)
    again = await store.gc(time.time() + 7200, grace=3600)
    assert again.snapshots_deleted == again.packs_deleted == 0 and again.snapshots_kept == 1


async def test_a_nats_restart_mid_way_is_log_unavailable_and_corrupts_nothing(
        own_nats: NatsServer, tmp_path: pathlib.Path) -> None:
    conn = await _connect(own_nats.url)
    try:
        s = WorkspaceStore(conn, cfg(timeout=2.0))
        await s.provision()
        src = tmp_path / "src"
        make_dir(src, files=200)
        first = await s.snapshot(tar_dir(src))
        w = TranscriptWriter("r1", 1, 1.0)
        await s.save_turn("t", run_id="r1", snapshot=first.digest, agent_session_id="a", messages=1,
                          workspace={}, agent_kind="claude", writer=w)
        (src / "work/blob.bin").write_bytes(os.urandom(300_000))
        task = asyncio.create_task(s.snapshot(tar_dir(src), parent=first.digest))
        own_nats.kill()
        try:
            second = await task
        except LogUnavailable:
            second = None
        with pytest.raises(LogUnavailable):
            await s.restore_to_dir(first.digest, tmp_path / "down")
        with pytest.raises(LogUnavailable):
            await s.load_head("t")
        own_nats.start()
        head, _ = await s.load_head("t")
        assert head is not None and head.snapshot == first.digest
        await s.restore_to_dir(first.digest, tmp_path / "after")
        assert tree(tmp_path / "after")["work/src/f7.py"] == tree(src)["work/src/f7.py"]
        if second is not None:  # it finished before the kill: it must be whole
            await s.restore_to_dir(second.digest, tmp_path / "second")
        third = await s.snapshot(tar_dir(src), parent=first.digest)
        await s.restore_to_dir(third.digest, tmp_path / "third")
        assert tree(tmp_path / "third")["work/blob.bin"] == tree(src)["work/blob.bin"]
    finally:
        await conn.close()
