"""The epoch fence of the delivery log, as one pure rule (docs/design.md §4.1).

A writer holds a claim at epoch ``E``. Before it writes (a ``fence`` or a ``close``), and
after JetStream refused one of its appends (the head was not the record it expected), it
reads the log's last record, the *tail*, and asks :func:`judge` what that record means for
it. The writer (:mod:`baton.log._writer`) does the I/O and turns the verdict into its
outcome; nothing else decides.

The rule, for a writer at epoch ``E``:

* a record of a **higher epoch** at the tail, of any kind, means a successor fenced the
  log: the writer has lost the claim and never writes again (``LOST``, it latches);
* a **close** of epoch ``<= E`` means the log is final: a fence is refused, a close has
  nothing left to do (``CLOSED``);
* anything else (no record at all, a chunk or fence of epoch ``<= E``) may be written on
  by a fence or a close, which compare on the tail's sequence (``WRITE``);
* an **append** never writes over a tail it did not expect: unless a higher epoch is there
  it is an ``AppendConflict`` (``CONFLICT``), and the driver re-aligns and resyncs (a
  resync is judged as a fence: it adopts the tail the fence would write on).

Only the tail's kind and epoch count; a record without baton headers reads as a chunk of
epoch 0 (:func:`baton.log._headers.parse_record`), so it is never taken for a fence or a
close.
"""
from __future__ import annotations

import enum

from baton.log._headers import StoredRecord


class Op(enum.Enum):
    """What the writer is about to do on the tail."""

    FENCE = "fence"    #: append its fence record (and :meth:`LogWriter.resync`: adopt the tail)
    APPEND = "append"  #: its chunk's compare failed on this tail
    CLOSE = "close"    #: append its close record


class Verdict(enum.Enum):
    """What the tail means for the writer."""

    WRITE = "write"        #: write on top of the tail (compare on its sequence, 0 if none)
    LOST = "lost"          #: a higher epoch is at the tail: latch, raise RunClaimLost
    CLOSED = "closed"      #: the log ends with a close of this or a lower epoch
    CONFLICT = "conflict"  #: the head moved, not to a higher epoch: AppendConflict


def judge(tail: StoredRecord | None, epoch: int, op: Op) -> Verdict:
    """What the log's last record means for a writer at ``epoch`` about to do ``op``.

    Args:
        tail: the log's last record (parsed headers), ``None`` for an empty log.
        epoch: the writer's claim epoch (>= 1).
        op: the writer's operation.

    Returns:
        The verdict (see the module docstring for the rule).
    """
    if tail is not None and tail.epoch > epoch:
        return Verdict.LOST
    if op is Op.APPEND:
        return Verdict.CONFLICT
    if tail is not None and tail.kind == "close":
        return Verdict.CLOSED
    return Verdict.WRITE


def describe(tail: StoredRecord) -> str:
    """The tail as :attr:`RunClaimLost.observed` names it: ``"<kind>@<epoch>"``."""
    return f"{tail.kind}@{tail.epoch}"
