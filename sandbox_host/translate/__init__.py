"""Journal → AG-UI translators (docs/design.md §5.3): pure, deterministic state machines.

``translator_for(fmt, run_id, thread_id)`` returns a fresh translator; feed it complete
journal lines with ``feed(line)`` and close it with ``finish(exit_code, trailing_fragment)``.
"""
from __future__ import annotations

from typing import Iterable

from sandbox_host.journal import JournalOversized, LineSplitter
from sandbox_host.translate._base import INCOMPLETE, Chunk, Translator
from sandbox_host.translate.claude import ClaudeTranslator
from sandbox_host.translate.codex import CodexTranslator

TRANSLATORS: dict[str, type[Translator]] = {
    ClaudeTranslator.format: ClaudeTranslator,
    CodexTranslator.format: CodexTranslator,
}


def translator_for(fmt: str, run_id: str, thread_id: str) -> Translator:
    """A fresh translator for a journal format.

    Args:
        fmt: ``"claude-stream-json"`` | ``"codex-exec-json"``.
        run_id: our run id (``RUN_STARTED.runId``; prefix of generated ids).
        thread_id: our thread id.

    Raises:
        ValueError: for an unknown format.
    """
    cls = TRANSLATORS.get(fmt)
    if cls is None:
        raise ValueError(f"unknown journal format {fmt!r}; known: {', '.join(sorted(TRANSLATORS))}")
    return cls(run_id, thread_id)


def translate_bytes(fmt: str, data: bytes, run_id: str, thread_id: str, exit_code: int | None = 0) -> list[Chunk]:
    """Translate a whole journal held in memory (tests, benchmarks, the reaper).

    Complete lines are fed; bytes after the last ``\\n`` are the trailing fragment.
    """
    tr = translator_for(fmt, run_id, thread_id)
    splitter = LineSplitter()  # the lines a host follows (one too long to hold, cut alike)
    out: list[Chunk] = []
    for line in splitter.feed(data):
        out += tr.feed_oversized(line.data, line.size) if isinstance(line, JournalOversized) else tr.feed(line.data)
    out += tr.finish(exit_code, splitter.pending or None, splitter.pending_size)
    return out


def translate_lines(tr: Translator, lines: Iterable[bytes]) -> list[Chunk]:
    """Feed lines to ``tr`` and return every chunk (without finishing)."""
    out: list[Chunk] = []
    for line in lines:
        out += tr.feed(line)
    return out


__all__ = ["INCOMPLETE", "Chunk", "ClaudeTranslator", "CodexTranslator", "TRANSLATORS", "Translator",
           "translate_bytes", "translate_lines", "translator_for"]
