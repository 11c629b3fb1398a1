"""The run vocabulary, defined once: status names, the terminal set, host chunk names.

Every service speaks of a run's status by these lower-case names (the wire form of
``baton.v1.RunStatus`` without its prefix, as the HTTP API shows them) and recognises the
host's own ``CUSTOM`` chunks by these names (docs/design.md §3.1, §4.2).
"""
from __future__ import annotations

from typing import Final, Literal

from baton.v1 import runs_pb2

StatusName = Literal["running", "interrupted", "completed", "failed", "aborted"]

#: Status name → ``RunStatus`` value.
STATUS_TO_PB: Final[dict[str, int]] = {
    "running": runs_pb2.RUN_STATUS_RUNNING,
    "interrupted": runs_pb2.RUN_STATUS_INTERRUPTED,
    "completed": runs_pb2.RUN_STATUS_COMPLETED,
    "failed": runs_pb2.RUN_STATUS_FAILED,
    "aborted": runs_pb2.RUN_STATUS_ABORTED,
}
#: ``RunStatus`` value → status name.
PB_TO_STATUS: Final[dict[int, str]] = {v: k for k, v in STATUS_TO_PB.items()}
#: Every status name, in lifecycle order.
STATUSES: Final[tuple[str, ...]] = tuple(STATUS_TO_PB)
#: Statuses after which a run never changes again. ``interrupted`` (a HITL pause) is not one.
TERMINAL: Final[frozenset[str]] = frozenset({"completed", "failed", "aborted"})
#: The same set as ``RunStatus`` values.
TERMINAL_PB: Final[frozenset[int]] = frozenset(STATUS_TO_PB[s] for s in TERMINAL)
#: Statuses a delivery log's close record may carry.
CLOSE_STATUSES: Final[frozenset[str]] = TERMINAL | {"interrupted"}

#: The host's first chunk of a fresh run: carries the run input (``value.messages``).
RUN_ACCEPTED: Final = "run.accepted"
#: The host's confirmation of a cancel (process gone, sandbox destroyed).
RUN_CANCELLED: Final = "run.cancelled"
#: A reader's notice that retention dropped chunks it asked for (``value.earliestOffset``).
STREAM_GAP: Final = "stream.gap"
#: A reader's notice that the run's log was compacted to its final snapshot: a join from the
#: start gets this (``value.snapshotOffset``), then the snapshot, then the end.
STREAM_COMPACTED: Final = "stream.compacted"
#: A join from a snapshot's newest messages (``messages=N``): before its ``MESSAGES_SNAPSHOT``,
#: how many older messages were left out and the cursor that pages them (docs/api.md).
SNAPSHOT_WINDOW: Final = "snapshot.window"


def status_name(status: int) -> str:
    """The lower-case name of a ``RunStatus`` value (``"unspecified"`` for an unknown one)."""
    return PB_TO_STATUS.get(status, "unspecified")


def record_status(record: runs_pb2.RunRecord) -> str:
    """The record's status as a lower-case name; an unset status reads as ``running``."""
    return PB_TO_STATUS.get(record.status, "running")


def is_host_chunk(chunk: dict[str, object], name: str) -> bool:
    """Whether ``chunk`` is the host's ``CUSTOM`` chunk called ``name``."""
    return chunk.get("type") == "CUSTOM" and chunk.get("name") == name


#: Most inputs (tool approvals and steered messages together) one run keeps (docs/hitl.md): a
#: steer beyond it is refused, so a client in a loop cannot grow a run record without bound.
MAX_RUN_INPUTS = 256
#: Most runs one thread's queue holds (docs/hitl.md): an enqueue beyond it is 429 QUEUE_FULL.
MAX_QUEUED_RUNS = 64
#: Bytes one input may carry in each of its text fields (a steered message, an approval's
#: reason, its tool input and updated input as JSON), UTF-8.
MAX_INPUT_TEXT = 64 * 1024
#: Most readers one batched presence call (``RegisterReaders``, ``UnregisterReaders``) names:
#: each is one operation of the call's etcd transaction, and etcd refuses more than 128
#: (its ``--max-txn-ops`` default) with the record's own write beside them.
MAX_READERS_PER_CALL = 64
#: Bytes a run record may hold once serialized (``RunRecord.ByteSize()``), its inputs
#: included: etcd refuses a request over 1.5 MiB (its ``--max-request-bytes`` default) and a
#: record's transaction carries its indexes too, so an input that would take the record past
#: this is refused (``TOO_MANY``: 429 TOO_MANY_INPUTS) instead of failing in etcd.
MAX_RECORD_BYTES = 1024 * 1024
#: The largest input payload one sandbox inbox line carries, in bytes (one line of compact
#: JSON: a steered message or an approval's answer as the agent reads it).
MAX_INPUT_PAYLOAD = 64 * 1024 + 1024
