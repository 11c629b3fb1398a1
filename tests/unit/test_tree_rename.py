"""A sandbox tree's tar renamed from the exported form (``work/``, ``home/``) to other top
names (the daemon's check of an import) keeps long names: a PAX ``path`` header read with a member must not be
written over its new name (a Codex rollout's path is longer than a tar header's 100 bytes)."""
from __future__ import annotations

import io
import tarfile

import pytest

from sandbox_host.providers._tree import renamed_for_put

pytestmark = pytest.mark.unit

ROLLOUT = "/.codex/sessions/2026/12/03/rollout-2026-12-03T08-30-00-01a23b03-9114-7b6f-81ef-79492f53afa3.jsonl"
LONG_DIR = "/" + "d" * 120


def _tar(members: list[tuple[str, bytes | None, str | None]]) -> bytes:
    """A PAX tar of ``(name, content, hard link target)`` (content ``None``: a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.LNKTYPE, link
                t.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _read(data: bytes) -> dict[str, tuple[bytes | None, str]]:
    out: dict[str, tuple[bytes | None, str]] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as t:
        for m in t:
            f = t.extractfile(m) if m.isfile() else None
            out[m.name] = (f.read() if f is not None else None, m.linkname)
    return out


def test_renamed_for_put_keeps_long_names_and_links() -> None:
    data = _tar([("home", None, None), (f"home{ROLLOUT}", b"rollout", None), ("work", None, None),
                 (f"work{LONG_DIR}", b"x", None), ("work/link", None, f"work{LONG_DIR}")])
    got = _read(renamed_for_put(data, {"work": "workspace", "home": "home/agent"}))
    assert got == {"home/agent": (None, ""), f"home/agent{ROLLOUT}": (b"rollout", ""), "workspace": (None, ""),
                   f"workspace{LONG_DIR}": (b"x", ""), "workspace/link": (None, f"workspace{LONG_DIR}")}
