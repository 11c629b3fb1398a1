"""Print the requirements of ``baton-runs[EXTRAS]`` from pyproject.toml, one a line (stdlib only).

Usage: python3 scripts/image_requirements.py server,docker,kubernetes,cli

The Dockerfile installs these (with requirements.lock as constraints) in a layer of their own,
before the source is copied, so a source change does not reinstall the dependencies;
scripts/build_image.sh fills the offline wheelhouse from the same list. Self-references
(``baton-runs[cli,server]``) are expanded; environment markers are kept for pip to evaluate.
"""
from __future__ import annotations

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def requirements(extras: list[str]) -> list[str]:
    """The base dependencies and those of ``extras`` (recursively), in file order, unique."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    out: list[str] = list(project["dependencies"])
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for spec in project["optional-dependencies"][extra]:
            self_ref = re.fullmatch(r"baton-runs\[([\w,\s-]+)\]", spec.strip())
            if self_ref:
                todo += [e.strip() for e in self_ref[1].split(",")]
            elif spec not in out:
                out.append(spec)
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1].split(",") if len(sys.argv) > 1 else [])))
