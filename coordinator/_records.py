"""Pure rules over run records (docs/design.md §3.1): terminal states, field masks, index shape.

Nothing here talks to etcd, so every rule is unit-testable on its own.
"""
from __future__ import annotations

from typing import Iterable

from google.protobuf.message import Message

from baton.errors import InvalidArgument
from baton.runs import TERMINAL_PB
from baton.v1.runs_pb2 import RunRecord, RunStatus

TERMINAL = TERMINAL_PB

# Paths a field mask may name. Identity and the store's own bookkeeping are not writable:
# run_id/thread_id key the indexes, tenant owns the thread (threads/<t>/tenant), revision is
# the store's, driver_epoch only ever rises, by ClaimRun (the fence, docs/design.md §3.2), and
# thread_seq is the run's number in its thread, given once at creation (baton/thread_order.py).
_READ_ONLY = frozenset({"run_id", "thread_id", "revision", "tenant", "driver_epoch", "last_takeover",
                        "thread_seq"})
WRITABLE = frozenset(f.name for f in RunRecord.DESCRIPTOR.fields) - _READ_ONLY


def is_terminal(status: int) -> bool:
    """Completed, failed and aborted are terminal; interrupted (a HITL pause) is not."""
    return status in TERMINAL


#: Looked up once: an enum attribute of a protobuf module is a slow lookup, and the indexes
#: ask this several times per write.
_RUNNING = RunStatus.RUN_STATUS_RUNNING


def is_active(rec: RunRecord | None) -> bool:
    """A run counts as its thread's active run while it is ``running``."""
    return rec is not None and rec.status == _RUNNING


def is_reclaimable(rec: RunRecord | None) -> bool:
    """Indexed for the reaper: running and detached (docs/design.md §3.3, §7)."""
    return is_active(rec) and rec is not None and rec.HasField("detached_since")


def is_starting(rec: RunRecord | None) -> bool:
    """Indexed for the reaper: running, and its ``StartRun`` has not made the input durable.

    Such a run is driven only by a ``StartRun`` of its own id (see ``RunRecord.starting``).
    """
    return is_active(rec) and rec is not None and rec.starting


def is_live(rec: RunRecord | None) -> bool:
    """Indexed as live (``live/<run>``): the failover sweep and the presence catch-up read
    only these. The same set as :func:`is_active`, named for the index."""
    return is_active(rec)


def is_ended(rec: RunRecord | None) -> bool:
    """Indexed for retention (``ended/<µs>/<run>``): the record is terminal."""
    return rec is not None and is_terminal(rec.status)


def ended_at(rec: RunRecord) -> float:
    """When a terminal run ended, for retention: ``finished_at``, else ``started_at``.

    The host stamps ``finished_at`` with the terminal status; a record written without it
    (by an older host, or a test) ages from its start, which is never later.
    """
    return rec.finished_at if rec.HasField("finished_at") else rec.started_at


def cancels_on_disconnect(rec: RunRecord) -> bool:
    """Whether the run is cancelled (not detached) when its last reader leaves.

    Only an explicit ``cancel_on_disconnect`` does so: the proto3 default (false, what a
    client that omits the field sends) detaches, so no client cancels runs by omission.
    The deprecated ``detach_on_disconnect`` is not read.
    """
    return rec.cancel_on_disconnect


def check_paths(paths: Iterable[str]) -> list[str]:
    """Validate field-mask paths (top-level RunRecord field names).

    Raises:
        InvalidArgument: naming ``update_mask`` for an unknown or read-only path.
    """
    out = list(paths)
    for p in out:
        if p not in WRITABLE:
            why = "is read-only" if p in _READ_ONLY else "is not a RunRecord field"
            raise InvalidArgument("update_mask", f"path {p!r} {why}")
    return out


def check_enums(message: Message, prefix: str) -> None:
    """Refuse enum values the schema does not name, anywhere in ``message``.

    Proto3 enums are open: a client may send any number (``status=99``) and protobuf keeps
    it; stored, it would be a record no state rule knows. Walks every set field (nested and
    repeated messages too; protobuf bounds the nesting).

    Raises:
        InvalidArgument: naming the field (``record.status``) for an unknown value.
    """
    for field, value in message.ListFields():
        name = f"{prefix}.{field.name}" if prefix else field.name
        repeated = field.is_repeated
        if field.enum_type is not None:
            known = field.enum_type.values_by_number
            for v in (value if repeated else (value,)):
                if v not in known:
                    names = ", ".join(known[n].name for n in sorted(known))
                    raise InvalidArgument(name, f"unknown value {v}: must be one of {names}")
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for i, m in enumerate(value if repeated else (value,)):
                check_enums(m, f"{name}[{i}]" if repeated else name)


def apply_mask(current: RunRecord, patch: RunRecord, paths: Iterable[str]) -> RunRecord:
    """``current`` with every path in ``paths`` taken from ``patch``.

    A path whose value is unset in ``patch`` clears the field (explicit clear, as in
    ``google.protobuf.FieldMask`` update semantics with ``replace_message_field``).

    Raises:
        InvalidArgument: the patch would set ``starting`` on a run that is not starting.
    """
    paths = list(paths)
    new = RunRecord()
    new.CopyFrom(current)
    if "starting" in paths and patch.starting and not current.starting:
        # Hosts decide who may drive a run from this flag only ever going true -> false.
        raise InvalidArgument("update_mask", "path 'starting' can only be cleared")
    # Through the base class: the paths are field names checked by check_paths, not literals.
    patch_msg: Message = patch
    new_msg: Message = new
    for p in paths:
        field = RunRecord.DESCRIPTOR.fields_by_name[p]
        if field.has_presence:
            if patch_msg.HasField(p):
                if field.message_type is not None:
                    getattr(new, p).CopyFrom(getattr(patch, p))
                else:
                    setattr(new, p, getattr(patch, p))
            else:
                new_msg.ClearField(p)
        else:
            setattr(new, p, getattr(patch, p))
    return new
