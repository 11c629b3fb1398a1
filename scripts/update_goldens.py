"""Rewrite the golden chunk sequences of tests/sandbox/golden from the translator.

Usage: python scripts/update_goldens.py [--check]

The golden tests (tests/sandbox/test_golden.py) only compare; they never write. Run this
after a deliberate change to a translator (sandbox_host/translate) or when a journal is
added to corpus/claude-stream-json or corpus/codex-exec-json. With --check nothing is
written: it lists the goldens that differ and exits 1 when any does.

Reviewing the result (the goldens are checked by hand, they are the reference):

1. ``git diff --stat tests/sandbox/golden`` names the goldens that changed; every one must
   be explained by the change you made (a translator fix touches the journals that exercise
   it, not all of them).
2. ``git diff tests/sandbox/golden`` shows one chunk per line: read each changed chunk
   against journal-formats.md of the shared reference (which journal line produces it, which
   AG-UI event it must be) and against the AG-UI rules (``baton.agui.check_well_formed``).
3. Run ``pytest tests/sandbox/test_golden.py``: beside the exact comparison each journal's
   test re-derives the facts it pins from the journal itself (``FACTS``); a golden that
   drifted from the reference fails there even after it is rewritten.
4. Commit the goldens in their own commit, saying why they changed.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.sandbox._golden import GOLDEN_DIR, dump, golden_path, translate_file  # noqa: E402
from tests.sandbox.conftest import CLAUDE_FILES, CODEX_FILES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a golden differs")
    args = parser.parse_args(argv)
    GOLDEN_DIR.mkdir(exist_ok=True)
    changed: list[pathlib.Path] = []
    for journal in CLAUDE_FILES + CODEX_FILES:
        path = golden_path(journal)
        text = dump(translate_file(journal))
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            continue
        changed.append(path)
        if not args.check:
            path.write_text(text, encoding="utf-8")
    expected = {golden_path(j) for j in CLAUDE_FILES + CODEX_FILES}
    stale = sorted(set(GOLDEN_DIR.glob("*.json")) - expected)
    for path in changed:
        print(f"{'differs' if args.check else 'rewritten'}: {path.relative_to(ROOT)}")
    for path in stale:
        print(f"no journal (remove it): {path.relative_to(ROOT)}")
    if not changed and not stale:
        print("goldens up to date")
    elif not args.check:
        print("review: git diff tests/sandbox/golden (see this script's docstring)")
    return 1 if args.check and (changed or stale) else 0


if __name__ == "__main__":
    sys.exit(main())
