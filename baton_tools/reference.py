"""The uninterrupted replay of a journal: what a run that never failed delivers and saves.

The replay agent (agent kind ``replay``) writes a recorded journal back at a speed; the
host's deterministic translator turns its bytes into AG-UI chunks. Feeding the same bytes
through the same translator in this process, with the same run and thread ids, gives the
exact chunk sequence (and, with :func:`baton.transcript.build_transcript`, the transcript)
of a run without any failure: the reference the demo and the fault suite compare against.
"""
from __future__ import annotations

import pathlib
from typing import Any, Sequence

#: The replay agent waits this long before each line without a timestamp (divided by the
#: speed we send); see ``sandbox_host/agents/_replay.py``.
REPLAY_LINE_DELAY = 0.05
REPLAY_MAX_GAP = 5.0


def reference_chunks(journal_path: pathlib.Path, fmt: str, run_id: str, thread_id: str) -> list[dict[str, Any]]:
    """The chunk sequence of the journal replayed without interruption (what the host's
    translator produces for these bytes, this run id and thread id; exit code 0)."""
    from sandbox_host.translate import translator_for

    data = journal_path.read_bytes()
    lines = data.split(b"\n")
    trailing = lines.pop()  # b"" when the file ends with a newline
    tr = translator_for(fmt, run_id=run_id, thread_id=thread_id)
    out: list[dict[str, Any]] = []
    for line in lines:
        out += tr.feed(line)
    out += tr.finish(0, trailing)
    return out


def expected_status(chunks: Sequence[dict[str, Any]]) -> str:
    """The final status the uninterrupted replay ends with: ``completed`` (or ``interrupted``)
    after ``RUN_FINISHED``, ``failed`` otherwise (the agent's own failure)."""
    last = chunks[-1]["type"] if chunks else None
    if last == "RUN_FINISHED":
        outcome = chunks[-1].get("outcome")
        return "interrupted" if isinstance(outcome, dict) and outcome.get("type") == "interrupt" else "completed"
    return "failed"


def speed_for(journal: pathlib.Path, seconds: float) -> float:
    """The replay speed that spreads the journal's lines over about ``seconds``."""
    n_waits = max(1, journal.read_bytes().count(b"\n") - 1)
    per_line = min(seconds / n_waits, REPLAY_MAX_GAP)
    return max(0.001, min(1000.0, REPLAY_LINE_DELAY / per_line))
