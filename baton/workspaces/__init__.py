"""Workspaces: a thread's sandbox tree snapshotted at every turn's end (docs/design.md "Workspaces").

Public surface::

    store = WorkspaceStore(nc, WorkspaceConfig.from_env())
    await store.provision()                                   # idempotent: Object Store + KV bucket
    info = await store.snapshot(tar, parent=head.snapshot)    # SnapshotInfo(digest, files, bytes_*)
    await store.restore_to_dir(digest, path)                  # or: tar = await store.restore_tar(digest)
    head, rev = await store.load_head(thread_id)              # ThreadHead | None
    await store.save_turn(thread_id, run_id=..., snapshot=..., agent_session_id=..., messages=n,
                          workspace=spec, agent_kind=..., writer=TranscriptWriter(...))   # fenced
    await store.fork(src_thread, run_id, new_thread, writer)
    await store.delete_thread(thread_id); report = await store.gc(now, grace)
"""
from baton.workspaces._config import WorkspaceConfig
from baton.workspaces._gc import GcReport
from baton.workspaces._store import SnapshotInfo, WorkspaceStore
from baton.workspaces.heads import ForkedFrom, ThreadHead, TurnRecord
from baton.workspaces.manifest import Entry, Manifest
from baton.workspaces.paths import Excludes

__all__ = [
    "Entry",
    "Excludes",
    "ForkedFrom",
    "GcReport",
    "Manifest",
    "SnapshotInfo",
    "ThreadHead",
    "TurnRecord",
    "WorkspaceConfig",
    "WorkspaceStore",
]
