"""The delivery log and the transcripts store on NATS JetStream (docs/design.md §4).

Public surface::

    cfg = LogConfig.from_env()
    log = await DeliveryLog.connect(nats_url, cfg)   # or DeliveryLog(nc, cfg)
    await log.provision()                           # idempotent
    w = log.writer(run_id, epoch)                   # LogWriter: fence / append / close
    recs = await log.stored_headers(run_id, before=fence_seq)   # list[StoredRecord]
    async with log.read(run_id, after="-1") as r:   # LogReader
        async for offset, chunk in r: ...
    ts = TranscriptStore(nc, cfg)                   # load / save with compare on revision
    found = await latest_snapshot(nc, cfg, run_id)  # (Snapshot, seq) | None
"""
from baton.log._config import LogConfig
from baton.log._headers import CloseStatus, Kind, Origin, StoredRecord
from baton.log._log import DeliveryLog, provision_with_patience
from baton.log._reader import LogReader, parse_offset
from baton.log._snapshots import latest as latest_snapshot
from baton.log._snapshots import snapshot_subject
from baton.log.snapshot import Snapshot, SnapshotPolicy
from baton.log._transcript_fence import TranscriptWriter
from baton.log._transcripts import TranscriptStore
from baton.log._writer import LogWriter, WriteObserver

__all__ = [
    "CloseStatus",
    "DeliveryLog",
    "Kind",
    "LogConfig",
    "LogReader",
    "LogWriter",
    "Origin",
    "StoredRecord",
    "TranscriptStore",
    "TranscriptWriter",
    "WriteObserver",
    "Snapshot",
    "SnapshotPolicy",
    "latest_snapshot",
    "parse_offset",
    "snapshot_subject",
    "provision_with_patience",
]
