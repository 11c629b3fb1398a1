"""The state a :class:`~sandbox_host.driver.RunDriver` shares with its method mixins.

``driver_stored`` and ``driver_transcript`` hold methods of the driver, kept apart so
``driver.py`` stays about supervising and streaming; they read and set the attributes
declared here, which ``RunDriver.__init__`` assigns. Declared once, for the type checker.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.errors import TranscriptFenced
from baton.transcript import TranscriptBuilder
from baton.v1 import runs_pb2
from sandbox_host import machine as M
from sandbox_host.align import Aligner

if TYPE_CHECKING:
    from baton.log import LogWriter
    from sandbox_host.deps import HostDeps

__all__ = ["DriverState"]


class DriverState:
    """Attributes of ``RunDriver`` its mixins use (no behaviour)."""

    deps: "HostDeps"
    record: runs_pb2.RunRecord
    run_id: str
    epoch: int
    mode: str  # the driver's ``Mode``: fresh, attach or finalize
    writer: "LogWriter"
    fence_seq: int | None
    machine: M.RunMachine
    builder: TranscriptBuilder
    input_messages: list[dict[str, Any]]
    _aligner: Aligner | None
    _inputs_loaded: bool
    _input_missing: bool
    _transcript_rev: int | None
    _transcript_loaded: bool
    _transcript_fenced: TranscriptFenced | None
    _snap_dirty: bool

    if TYPE_CHECKING:
        def post(self, event: M.Event) -> bool: ...
