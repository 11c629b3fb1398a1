"""Golden chunk sequences: where they live, how they are written (one chunk per line)."""
from __future__ import annotations

import json
import os
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


def load_or_regen(journal: pathlib.Path) -> list[dict[str, Any]]:
    """The committed golden; with ``BATON_REGEN_GOLDEN=1`` rewritten from the translator first
    (review the diff before committing: the goldens are checked by hand)."""
    path = golden_path(journal)
    if os.environ.get("BATON_REGEN_GOLDEN") == "1":
        path.write_text(dump(translate_file(journal)), encoding="utf-8")
    return json.loads(path.read_text(encoding="utf-8"))
