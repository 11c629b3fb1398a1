"""Which paths a sandbox daemon serves (pure), and the per-sandbox token."""
from __future__ import annotations

import pytest

from sandbox_host.daemon import sandbox_token
from sandbox_host.daemon.paths import PathRefused, confine, normalize_roots


@pytest.mark.parametrize("path, outside", [("../x", False), ("a/../../x", False), ("", False),
                                           ("/etc/passwd", True), ("/srv/rootx/a", True)])
def test_confine_refuses(path: str, outside: bool) -> None:
    with pytest.raises(PathRefused) as caught:
        confine(path, ("/srv/root", "/var/j/run.ndjson"), "/srv/root")
    assert caught.value.outside is outside


def test_confine_accepts() -> None:
    roots = ("/srv/root", "/var/j/run.ndjson")
    assert confine("a/b", roots, "/srv/root") == "/srv/root/a/b"
    assert confine("/srv/root/./a", roots, "/srv/root") == "/srv/root/a"
    assert confine("/var/j/run.ndjson", roots, "/srv/root") == "/var/j/run.ndjson"
    assert sandbox_token("", "k") == "" and sandbox_token("t", "a") != sandbox_token("t", "b")


def test_roots_must_be_absolute() -> None:
    with pytest.raises(ValueError):
        normalize_roots(["relative"])
    with pytest.raises(ValueError):
        normalize_roots([])
