"""The transcript fence (docs/design.md §4.2): which saved transcript a writer may replace.

Pure: no I/O, so the rule is table-tested without servers. The store
(:class:`~baton.log._transcripts.TranscriptStore`) applies it inside the write: it reads the
stored value's writer, asks :func:`may_replace`, and replaces the value with
compare-and-set on the revision it read, so no save lands between the check and the put.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from baton.thread_order import thread_position

Verdict = Literal["replace", "newer-epoch", "later-run"]


@dataclass(frozen=True)
class TranscriptWriter:
    """Who saved a transcript: the run, its claim's epoch, the run's start time and number.

    Attributes:
        run_id: the run whose driver saved.
        epoch: the claim's epoch (>= 1).
        started_at: the run record's ``started_at`` (seconds since the epoch).
        seq: the run record's ``thread_seq``: its number among its thread's runs, which
            orders them (:mod:`baton.thread_order`); 0 for a run created before numbers
            (ordered before every numbered run, then by ``started_at`` and run id).
    """

    run_id: str
    epoch: int
    started_at: float
    seq: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run_id, "epoch": self.epoch, "at": self.started_at}
        if self.seq:
            out["seq"] = self.seq
        return out

    @classmethod
    def from_json(cls, value: Any) -> "TranscriptWriter | None":
        """The writer stored with a value, or ``None`` for a value saved without one
        (older values, or a malformed field: anyone may replace it)."""
        if not isinstance(value, dict):
            return None
        try:
            return cls(str(value["run"]), int(value["epoch"]), float(value["at"]), int(value.get("seq") or 0))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def position(self) -> tuple[int, float, str]:
        """Where the writer's run sits among its thread's runs (:func:`thread_position`)."""
        return thread_position(self.seq, self.started_at, self.run_id)


def verdict(stored: TranscriptWriter | None, writer: TranscriptWriter) -> Verdict:
    """Whether ``writer`` may replace a transcript saved by ``stored``.

    Args:
        stored: the writer of the saved value (``None``: nothing saved, or saved by an
            older version without a writer identity).
        writer: the writer that wants to save.

    Returns:
        ``"replace"`` when it may; ``"newer-epoch"`` when ``stored`` is the same run (same
        id, start time and number) at a higher epoch (a successor took the run over);
        ``"later-run"`` when ``stored`` is a later run of the thread, by the thread's order
        (:func:`baton.thread_order.thread_position`: the runs' numbers, never their clocks;
        a run id started again after retention is a new run with a new number). The same
        writer replaces its own value, and an equal epoch of the same run replaces too
        (the log fence already allows one writer per epoch).
    """
    if stored is None:
        return "replace"
    if (stored.run_id, stored.started_at, stored.seq) == (writer.run_id, writer.started_at, writer.seq):
        return "newer-epoch" if stored.epoch > writer.epoch else "replace"
    # Another run, or the same run id started again after retention deleted the old record
    # and its id stopped being retired (docs/design.md §3.5): the later run wins, so the
    # old run's higher epochs cannot fence the new run out.
    if stored.position > writer.position:
        return "later-run"
    return "replace"


def may_replace(stored: TranscriptWriter | None, writer: TranscriptWriter) -> bool:
    """``verdict(stored, writer) == "replace"``."""
    return verdict(stored, writer) == "replace"
