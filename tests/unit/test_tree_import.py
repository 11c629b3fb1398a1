"""A sandbox tree's import (``_tree.import_local``, what the daemon's ``ImportTree`` runs)
refuses the same hostile tars with tarfile's ``data`` filter and without it (a sandbox image's
Python may lack it: Debian bookworm's 3.11.2), and extracts a good tree the same way."""
from __future__ import annotations

import io
import os
import pathlib
import tarfile

import pytest

from baton.errors import SandboxBuildFailed
from sandbox_host.providers._tree import HAS_FILTERS, import_local

pytestmark = pytest.mark.unit
FILTERS = [False, True] if HAS_FILTERS else [False]


def _tar(*members: tuple[str, str, object]) -> bytes:
    """``(name, kind, content or link target)``, kind ``f`` file, ``d`` dir, ``s`` symlink, ``h`` hard link."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, what in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if kind == "f":
                data = str(what).encode()
                info.size, info.mode = len(data), 0o4777
                t.addfile(info, io.BytesIO(data))
                continue
            info.type = {"d": tarfile.DIRTYPE, "s": tarfile.SYMTYPE, "h": tarfile.LNKTYPE}[kind]
            info.mode = 0o755
            if kind in "sh":
                info.linkname = str(what)
            t.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("filters", FILTERS)
def test_a_good_tree_is_extracted(tmp_path: pathlib.Path, filters: bool) -> None:
    work = tmp_path / "work"
    import_local(_tar(("work", "d", None), ("work/a", "d", None), ("work/a/f", "f", "one"),
                      ("work/l", "s", "a/f"), ("work/h", "h", "work/a/f")), str(work), None, filters=filters)
    assert (work / "a" / "f").read_text() == "one" and os.readlink(work / "l") == "a/f"
    assert (work / "h").read_text() == "one" and os.stat(work / "h").st_ino == os.stat(work / "a" / "f").st_ino
    assert (work / "a" / "f").stat().st_mode & 0o7777 == 0o755  # setuid and group/other write cleared


@pytest.mark.parametrize("filters", FILTERS)
@pytest.mark.parametrize("members", [
    [("work/l", "s", "/etc")],
    [("work/l", "s", "../../outside")],
    [("work/d", "d", None), ("work/d/l", "s", "../../x")],
    [("work/up", "s", ".."), ("work/up/escaped", "f", "x")],
], ids=["absolute-link", "link-out", "nested-link-out", "through-a-link"])
def test_links_out_of_the_tree_are_refused(tmp_path: pathlib.Path, filters: bool,
                                           members: list[tuple[str, str, object]]) -> None:
    work = tmp_path / "box" / "work"
    with pytest.raises(SandboxBuildFailed) as refused:
        import_local(_tar(*members), str(work), None, filters=filters)
    assert refused.value.step == "import"
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == ["work"]  # nothing landed beside it
    assert not (tmp_path / "outside").exists() and not (tmp_path / "box" / "escaped").exists()
