"""README.md's two commands; docs/operating.md's configuration table matches baton/config.py;
docs/api.md names every HTTP route. (The README's snippets run in tests/test_readme.py.)"""
from __future__ import annotations

import re

from baton.config import SETTINGS, markdown_table
from tests.deploy.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
OPERATING = (REPO / "docs" / "operating.md").read_text(encoding="utf-8")
API = (REPO / "docs" / "api.md").read_text(encoding="utf-8")


def test_the_two_commands() -> None:
    assert "make demo" in README and "make test" in README
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_configuration_table_is_the_generated_one() -> None:
    # `python -m baton.config` prints it; regenerate the docs/operating.md section when settings change.
    assert markdown_table() in OPERATING
    for s in SETTINGS:
        assert f"`{s.env}`" in OPERATING


def test_every_http_route_is_documented() -> None:
    from gateway.app import create_app  # noqa: F401  (the app module names every route)

    src = (REPO / "gateway" / "app.py").read_text()
    paths = set(re.findall(r'Route\("([^"]+)"', src))
    assert paths, "no routes found in gateway/app.py"
    for path in paths:
        # The docs name parameters as the API does ({runId}), whatever the convertor.
        shown = re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: "{" + {"run_id": "runId", "thread_id": "threadId"}.get(m[1], m[1]) + "}", path)
        assert f"`{shown}" in API or f"{shown}`" in API or f" {shown}" in API, path
