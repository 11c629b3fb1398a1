"""Golden chunk sequences: where they live, how they are written (one chunk per line).

The tests only read them; ``scripts/update_goldens.py`` writes them.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

from sandbox_host.translate import translate_bytes

GOLDEN_DIR = pathlib.Path(__file__).with_name("golden")
RUN_ID = "run-golden"
THREAD_ID = "thread-golden"


def golden_path(journal: pathlib.Path) -> pathlib.Path:
    return GOLDEN_DIR / f"{journal.stem}.json"


def translate_file(journal: pathlib.Path) -> list[dict[str, Any]]:
    """The journal's chunks (exit code 0, as the replay agent exits)."""
    return translate_bytes(journal.parent.name, journal.read_bytes(), RUN_ID, THREAD_ID, exit_code=0)


def dump(chunks: list[dict[str, Any]]) -> str:
    return "[\n" + ",\n".join(json.dumps(c, ensure_ascii=False, sort_keys=True) for c in chunks) + "\n]\n"


def load(journal: pathlib.Path) -> list[dict[str, Any]]:
    """The committed golden of ``journal`` (``scripts/update_goldens.py`` rewrites them)."""
    return json.loads(golden_path(journal).read_text(encoding="utf-8"))  # type: ignore[no-any-return]
