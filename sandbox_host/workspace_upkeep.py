"""The host's workspace upkeep: collect snapshots no thread reaches, drop idle thread directories.

Every ``BATON_WORKSPACE_GC_INTERVAL`` seconds a host runs :meth:`WorkspaceStore.gc` (every
host does: a sweep is idempotent, and one never deletes an object younger than
``BATON_WORKSPACE_GC_GRACE``, so a snapshot being written is safe), then removes the thread
directories of this machine that have been idle for ``BATON_WORKSPACE_WARM_TTL`` seconds.
Only a directory that holds exactly a snapshot (its marker, written by the turn's snapshot)
is removed: the snapshot has it all, so the thread's next turn restores it on any host.
A directory in use by a run is unmarked, and kept.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from baton import config
from baton.errors import LogUnavailable

if TYPE_CHECKING:
    from baton.workspaces import WorkspaceStore

log = logging.getLogger("baton.sandbox_host.workspaces")


@dataclass(frozen=True)
class UpkeepSettings:
    """``every``, ``grace`` and ``warm_ttl`` in seconds (``every`` 0: no upkeep)."""

    every: float = 600.0
    grace: float = 3600.0
    warm_ttl: float = 3600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "UpkeepSettings":
        return cls(every=config.get_float("BATON_WORKSPACE_GC_INTERVAL", env),
                   grace=config.get_float("BATON_WORKSPACE_GC_GRACE", env),
                   warm_ttl=config.get_float("BATON_WORKSPACE_WARM_TTL", env))


async def sweep_once(store: "WorkspaceStore | None", providers: Mapping[str, Any], settings: UpkeepSettings,
                     now: float) -> None:
    """One sweep (see the module docstring); logs what it did, never raises a store error."""
    if store is not None:
        try:
            report = await store.gc(now, settings.grace)
            if report.snapshots_deleted or report.packs_deleted:
                log.info("workspace gc: %d snapshot(s) and %d pack(s) deleted (%d bytes); %d head(s)",
                         report.snapshots_deleted, report.packs_deleted, report.bytes_deleted, report.heads)
        except LogUnavailable as exc:
            log.warning("workspace gc not done: %s", exc)
    for provider in providers.values():
        removed = await provider.remove_idle_thread_dirs(now - settings.warm_ttl)
        if removed:
            log.info("%d idle thread director(ies) removed (%s)", removed, provider.name)


async def run_upkeep(store: "WorkspaceStore | None", providers: Mapping[str, Any], settings: UpkeepSettings) -> None:
    """Sweep every ``settings.every`` seconds until cancelled."""
    if settings.every <= 0:
        return
    while True:
        await asyncio.sleep(settings.every)
        try:
            await sweep_once(store, providers, settings, time.time())
        except OSError as exc:
            log.warning("workspace upkeep: %s", exc)
