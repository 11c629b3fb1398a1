"""The pure parts of workspaces (no servers): paths, excludes, manifests, packing, heads."""
from __future__ import annotations

import io
import os
import pathlib
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baton.errors import WorkspaceTooLarge, WorkspaceUnsafe
from baton.log import TranscriptWriter
from baton.workspaces._packing import read_tree
from baton.workspaces._unpack import write_dir, write_tar
from baton.workspaces.heads import ThreadHead, TurnRecord, forked, with_turn
from baton.workspaces.manifest import Entry, Manifest, Stored, decode, packs_to_rewrite
from baton.workspaces.paths import Excludes, link_stays_inside, safe_path

pytestmark = pytest.mark.unit


def make_tar(members: list[tuple[str, str, bytes | str]]) -> bytes:
    """(name, kind f|d|l|c|h, content or link target) -> tar bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if kind == "f":
                assert isinstance(data, bytes)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
                continue
            if kind == "d":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
            elif kind == "h":
                info.type, info.linkname = tarfile.LNKTYPE, str(data)
            elif kind == "c":
                info.type = tarfile.CHRTYPE
            tar.addfile(info)
    return buf.getvalue()


def pack_dict(tree) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    """The tree's packs' bytes (their temp files closed)."""
    out = {}
    for p in tree.packs:
        p.data.seek(0)
        out[p.name] = p.data.read()
        p.data.close()
    return out


def read(src: bytes, **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = dict(reusable={}, excludes=Excludes(), max_bytes=1 << 30, pack_bytes=1 << 20)
    args.update(kw)
    return read_tree(src, **args)  # type: ignore[arg-type]


# --- paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,want", [("./work/a", "work/a"), ("work//a/", "work/a"), (".", ""), ("work/./b", "work/b")])
def test_safe_path_normalizes(name: str, want: str) -> None:
    assert safe_path(name) == want


@pytest.mark.parametrize("name", ["/etc/passwd", "work/../../x", "..", "work/a\x00b", "C:/x"])
def test_safe_path_refuses(name: str) -> None:
    with pytest.raises(WorkspaceUnsafe):
        safe_path(name)


@pytest.mark.parametrize("path,target,inside", [
    ("work/a", "b", True), ("work/a", "../home/x", False), ("work/d/a", "../../work", True),
    ("work/a", "../../etc", False), ("work/a", "/usr/bin/python3", False), ("a", "..", False), ("work/a", "", False),
])
def test_link_stays_inside(path: str, target: str, inside: bool) -> None:
    assert link_stays_inside(path, target) is inside


def test_excludes_rooted_and_component_patterns() -> None:
    ex = Excludes.parse(" home/.codex/auth.json, node_modules ,*.pyc,work/tmp/*,, ")
    assert ex.excluded("home/.codex/auth.json")
    assert not ex.excluded("work/home/.codex/auth.json")
    assert ex.excluded("work/app/node_modules/x/y.js") and ex.excluded("work/node_modules")
    assert ex.excluded("work/a/b.pyc") and not ex.excluded("work/a/b.py")
    assert ex.excluded("work/tmp/x/y") and not ex.excluded("work/tmpx")
    assert not Excludes().excluded("anything")


# --- manifests -----------------------------------------------------------------------------

names = st.lists(st.text("abcxyz._-", min_size=1, max_size=6).filter(lambda s: s not in (".", "..")),
                 min_size=1, max_size=3).map("/".join)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, st.tuples(st.integers(0, 0o7777), st.integers(0, 2**33), st.integers(0, 10**9), st.booleans()),
                       max_size=20), st.one_of(st.none(), st.text("0123456789abcdef", min_size=64, max_size=64)))
def test_manifest_round_trips(files: dict[str, tuple[int, int, int, bool]], parent: str | None) -> None:
    # Keep only paths that are not a prefix-directory of another (a file cannot hold children).
    paths = sorted(p for p in files if not any(q.startswith(p + "/") for q in files))
    entries = tuple(Entry(p, "f", files[p][0], files[p][1], files[p][2], "ab" * 32, Stored("p" * 64, 7, files[p][2], files[p][3]))
                    for p in paths)
    m = Manifest(parent, {"p" * 64: 10**9 + 7} if entries else {}, entries)
    blob = m.encode()
    assert decode(blob) == m
    assert m.encode() == blob  # deterministic: the same tree has the same digest


def test_decode_refuses_tampered_entries() -> None:
    good = Manifest(None, {"p": 4}, (Entry("work/a", "f", 0o644, 0, 4, "d", Stored("p", 0, 4, False)),))
    for bad in (Entry("../x", "f", 0o644, 0, 4, "d", Stored("p", 0, 4, False)),
                Entry("work/l", "l", target="/etc"),):
        m = Manifest(None, {"p": 4}, (*good.entries, bad))
        with pytest.raises(WorkspaceUnsafe):
            decode(m.encode())
    under = Manifest(None, {"p": 4}, (Entry("work/l", "l", target="."),
                                      Entry("work/l/x", "f", 0o644, 0, 4, "d", Stored("p", 0, 4, False))))
    with pytest.raises(WorkspaceUnsafe):
        decode(under.encode())
    with pytest.raises(WorkspaceUnsafe):
        decode(b"not zlib")


def test_packs_to_rewrite_bounds_the_pack_count_and_drops_dead_packs() -> None:
    def f(i: int, pack: str, n: int) -> Entry:
        return Entry(f"work/{i}", "f", 0o644, 0, n, f"d{i}", Stored(pack, 0, n, False))
    m = Manifest(None, {"a": 100, "b": 100, "c": 100, "dead": 1000},
                 (f(1, "a", 100), f(2, "b", 90), f(3, "c", 50), f(4, "dead", 10)))
    assert packs_to_rewrite(m, max_packs=8) == {"dead"}
    assert packs_to_rewrite(m, max_packs=3) == {"dead", "c"}
    assert packs_to_rewrite(None, max_packs=1) == set()


# --- packing and unpacking -------------------------------------------------------------------

def test_read_tree_dedupes_skips_and_refuses() -> None:
    tar = make_tar([("work", "d", b""), ("work/a.txt", "f", b"hello " * 200), ("work/b.txt", "f", b"hello " * 200),
                    ("work/bin", "f", os.urandom(3000)), ("work/link", "l", "a.txt"), ("work/out", "l", "/etc/passwd"),
                    ("work/hard", "h", "work/bin"), ("work/dev", "c", b""), ("home/.codex/auth.json", "f", b"secret")])
    tree = read(tar, excludes=Excludes(("home/.codex/auth.json",)))
    paths = [e.path for e in tree.entries]
    assert paths == ["work", "work/a.txt", "work/b.txt", "work/bin", "work/hard", "work/link"]
    assert sorted(p for p, _ in tree.skipped) == ["work/dev", "work/out"]
    by = {e.path: e for e in tree.entries}
    assert by["work/a.txt"].stored == by["work/b.txt"].stored and by["work/a.txt"].stored.z  # type: ignore[union-attr]
    assert by["work/bin"].stored == by["work/hard"].stored and not by["work/bin"].stored.z  # type: ignore[union-attr]
    assert len(tree.packs) == 1 and tree.bytes_total == 1200 * 2 + 3000 * 2
    assert tree.bytes_new < 3000 + 200  # a.txt once, compressed; bin once
    # Reusing: a child whose contents are all known stores nothing.
    known = {e.digest: e.stored for e in tree.entries if e.stored}
    pack_dict(tree)
    again = read(tar, reusable=known, excludes=Excludes(("home/.codex/auth.json",)))
    assert again.packs == [] and again.bytes_new == 0
    with pytest.raises(WorkspaceTooLarge) as too:
        read(tar, max_bytes=2000)
    assert too.value.limit == 2000 and too.value.size > 2000
    for bad in ([("/etc/x", "f", b"x")], [("work/../../x", "f", b"x")], [("work/l", "l", "sub"), ("work/l/x", "f", b"x")]):
        with pytest.raises(WorkspaceUnsafe):
            read(make_tar(bad))  # type: ignore[arg-type]


def test_packs_seal_at_their_target_size() -> None:
    tar = make_tar([(f"work/f{i}", "f", os.urandom(400)) for i in range(10)])
    tree = read(tar, pack_bytes=1000)
    assert len(tree.packs) == 4 and all(e.stored and e.stored.pack for e in tree.entries)
    assert {e.stored.pack for e in tree.entries if e.stored} == set(pack_dict(tree))


def test_write_dir_and_tar_give_back_the_tree(tmp_path: pathlib.Path) -> None:
    tar = make_tar([("work", "d", b""), ("work/sub", "d", b""), ("work/sub/a", "f", b"a" * 5000), ("work/e", "f", b""),
                    ("work/link", "l", "sub/a"), ("home", "d", b""), ("home/.rc", "f", b"rc")])
    tree = read(tar)
    m = Manifest(None, {p.name: p.size for p in tree.packs}, tuple(tree.entries))
    packs = pack_dict(tree)
    # A symlink planted where a directory goes is removed, never followed.
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "work").symlink_to(outside)
    write_dir(m, packs, tmp_path / "t")
    assert list(outside.iterdir()) == []
    assert (tmp_path / "t/work/sub/a").read_bytes() == b"a" * 5000
    assert os.readlink(tmp_path / "t/work/link") == "sub/a" and (tmp_path / "t/work/e").read_bytes() == b""
    assert (tmp_path / "t/home/.rc").stat().st_mtime == 1_700_000_000
    out = io.BytesIO()
    write_tar(m, packs, out)
    again = read(out.getvalue())
    pack_dict(again)
    assert [(e.path, e.kind, e.digest, e.target) for e in again.entries] == [(e.path, e.kind, e.digest, e.target) for e in tree.entries]


# --- heads -----------------------------------------------------------------------------------

def test_heads_keep_the_last_turns_and_fork() -> None:
    w = TranscriptWriter("r0", 1, 1.0)
    head = None
    for i in range(5):
        head = with_turn(head, run_id=f"r{i}", turn=TurnRecord(f"s{i}", f"sess{i}", i * 2, float(i)),
                         workspace={"repo": "x"}, agent_kind="claude", writer=w, max_turns=3)
    assert head is not None and list(head.turns) == ["r2", "r3", "r4"]
    assert (head.snapshot, head.agent_session_id) == ("s4", "sess4")
    assert head.snapshots() == {"s2", "s3", "s4"}
    assert ThreadHead.decode(head.encode()) == head
    f = forked(head, source_thread="t1", run_id="r3", writer=TranscriptWriter("n1", 1, 9.0), now=9.0)
    assert (f.snapshot, f.agent_session_id, f.turns, f.forked_from.thread_id) == ("s3", "sess3", {}, "t1")  # type: ignore[union-attr]
    assert ThreadHead.decode(f.encode()) == f
    with pytest.raises(ValueError):
        ThreadHead.decode(b"[1]")


def test_config_from_env() -> None:
    from baton.workspaces import WorkspaceConfig
    c = WorkspaceConfig.from_env({"BATON_LOG_REPLICAS": "3", "BATON_WORKSPACE_EXCLUDES": "a/b, *.pyc",
                                  "BATON_WORKSPACE_MAX_BYTES": "1024", "BATON_WORKSPACE_IDLE_TTL": "60"})
    assert (c.replicas, c.max_bytes, c.idle_ttl, c.excludes.patterns) == (3, 1024, 60.0, ("a/b", "*.pyc"))
    assert WorkspaceConfig.from_env({}).excludes.excluded("home/.claude/.credentials.json")
    with pytest.raises(ValueError, match="BATON_WORKSPACE_MAX_BYTES"):
        WorkspaceConfig.from_env({"BATON_WORKSPACE_MAX_BYTES": "lots"})
