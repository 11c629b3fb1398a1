"""Small value types of the run driver: status names, the ``run.accepted`` chunk, a
re-opened sandbox, and a driver's statistics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from baton.v1 import runs_pb2
from sandbox_host import _machine as M

if TYPE_CHECKING:
    from sandbox_host.providers import Provider, SandboxHandle

Chunk = dict[str, Any]

STATUS_TO_PB = {
    "running": runs_pb2.RUN_STATUS_RUNNING,
    "interrupted": runs_pb2.RUN_STATUS_INTERRUPTED,
    "completed": runs_pb2.RUN_STATUS_COMPLETED,
    "failed": runs_pb2.RUN_STATUS_FAILED,
    "aborted": runs_pb2.RUN_STATUS_ABORTED,
}
PB_TO_STATUS = {v: k for k, v in STATUS_TO_PB.items()}
TERMINAL = frozenset({"completed", "failed", "aborted"})


def status_name(record: runs_pb2.RunRecord) -> str:
    """The record's status as a lower-case name (``running``, ``completed``, ...)."""
    return PB_TO_STATUS.get(record.status, "running")


def accepted_chunk(record: runs_pb2.RunRecord, messages: list[dict[str, Any]]) -> Chunk:
    """The ``CUSTOM run.accepted`` chunk (origin host) a fresh start appends first.

    It carries the run input's messages, so a successor host can rebuild the transcript
    (DESIGN.md §4.2) from the log alone.
    """
    return {"type": "CUSTOM", "name": "run.accepted",
            "value": {"runId": record.run_id, "threadId": record.thread_id,
                      "agent": record.agent.kind or None, "messages": messages}}


@dataclass
class _Sandbox:
    provider: "Provider"
    handle: "SandboxHandle"
    nonce: str
    destroyed: bool = False


@dataclass
class RunStats:
    """What a driver did (for tests, logs and the bench)."""

    stored_prefix: int = 0
    appended: int = 0
    replayed: int = 0
    first_append_at: float | None = None
    outcome: str | None = None
    decision: M.Decision | None = None
    errors: list[str] = field(default_factory=list)
