"""Leader election among coordinator replicas, and the leader-only task runner.

As etcd's ``client/v3/concurrency/election.go``: each replica puts ``election/<lease>``
under its own lease; the candidate with the lowest create revision leads; every other
candidate waits for the deletion of the one just before it (no thundering herd). The
leader runs the leader tasks (failover scheduler, reaper, presence sweeper) and cancels
them the moment it cannot prove it still holds its lease.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

from baton.errors import StoreUnavailable
from baton.retry import Attempts, Deadline
from baton.v1.coordinator_pb2 import HostInfo

from coordinator import _etcd as E
from coordinator._config import CoordinatorConfig
from coordinator._keys import prefix_end
from coordinator._store import RunStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaderContext:
    """What a leader-only task gets.

    Attributes:
        store: the etcd-backed store the RPCs use (records, claims, presence, hosts).
        config: the replica's configuration.
        replica_id: this replica's id.
        lease_id: the leader's election lease (gone = leadership gone).
    """

    store: RunStore
    config: CoordinatorConfig
    replica_id: str
    lease_id: int

    async def list_hosts(self) -> list[HostInfo]:
        """Live sandbox hosts (their session still holds)."""
        return await self.store.list_hosts(timeout=self.config.etcd_timeout)


LeaderTask = Callable[[LeaderContext], Awaitable[None]]


class _LeaseLost(Exception):
    pass


class LeaderElection:
    """Campaign for leadership for as long as :meth:`run` runs.

    Args:
        store: the store (its etcd adapter and keys are used for the election keys).
        config: ``election_ttl`` (seconds) and ``replica_id`` are read.
        tasks: leader-only tasks, started on winning, cancelled on losing.
    """

    def __init__(self, store: RunStore, config: CoordinatorConfig, tasks: Sequence[LeaderTask]) -> None:
        self.store = store
        self.config = config
        self.tasks = list(tasks)
        self.is_leader = asyncio.Event()
        self.terms = 0  # how many times this replica became leader

    async def run(self) -> None:
        """Campaign, lead, step down, campaign again... until cancelled."""
        pause = min(self.config.election_ttl / 3, 0.5)
        async for _ in Attempts(Deadline.never(), first_pause=pause, max_pause=pause):
            try:
                await self._term()
            except (StoreUnavailable, _LeaseLost, E.LeaseNotFound) as exc:
                log.warning("leader election: %s; campaigning again", exc)
            finally:
                self.is_leader.clear()

    async def _term(self) -> None:
        etcd, keys, cfg = self.store.etcd, self.store.keys, self.config
        lease_id, _ = await etcd.grant(max(1, math.ceil(cfg.election_ttl)), timeout=cfg.etcd_timeout)
        tasks: list[asyncio.Task[None]] = []
        try:
            key = keys.candidate(lease_id)
            r = await etcd.txn([], [E.put(key, cfg.replica_id.encode(), lease_id), E.get(key)],
                               timeout=cfg.etcd_timeout)
            my_rev = r.kvs(1)[0].create_revision
            keepalive = asyncio.create_task(self._keepalive(lease_id), name="election-keepalive")
            tasks.append(keepalive)
            campaign = asyncio.create_task(self._campaign_and_lead(key, my_rev, lease_id), name="election-campaign")
            tasks.append(campaign)
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
        finally:
            self.is_leader.clear()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Step down at once so another replica need not wait for the TTL.
            try:
                await asyncio.shield(etcd.revoke(lease_id, timeout=1.0))
            except (StoreUnavailable, E.LeaseNotFound):
                pass

    async def _keepalive(self, lease_id: int) -> None:
        ttl = self.config.election_ttl
        ka = self.store.etcd.keepalive_stream()
        last_ok = time.monotonic()
        try:
            while True:
                await asyncio.sleep(ttl / 3)
                try:
                    left = await ka.refresh(lease_id, timeout=ttl / 3)
                except StoreUnavailable:
                    if time.monotonic() - last_ok > ttl:
                        raise _LeaseLost(f"election lease {lease_id:x} not refreshed for {ttl}s")
                    continue
                if left <= 0:
                    raise _LeaseLost(f"election lease {lease_id:x} expired")
                last_ok = time.monotonic()
        finally:
            ka.close()

    async def _campaign_and_lead(self, key: bytes, my_rev: int, lease_id: int) -> None:
        etcd, keys, cfg = self.store.etcd, self.store.keys, self.config
        while True:
            kvs, rev = await etcd.range(keys.election, prefix_end(keys.election), keys_only=True,
                                        sort_by_create=True, timeout=cfg.etcd_timeout)
            if not any(kv.key == key for kv in kvs):
                raise _LeaseLost("election key gone")
            earlier = [kv for kv in kvs if kv.create_revision < my_rev]
            if not earlier:
                break
            # Wait for the candidate just before us to go (election.go waitDeletes).
            async for _rev, _events in etcd.watch([(earlier[-1].key, b"")], start_revision=rev + 1,
                                                   deletes_only=True):
                break
        log.info("replica %s is the coordinator leader", cfg.replica_id)
        self.terms += 1
        self.is_leader.set()
        ctx = LeaderContext(self.store, cfg, cfg.replica_id, lease_id)
        runners = [asyncio.create_task(self._supervise(t, ctx)) for t in self.tasks]
        runners.append(asyncio.create_task(self._watch_own_key(key, my_rev)))
        try:
            done, _ = await asyncio.wait(runners, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
        finally:
            for t in runners:
                t.cancel()
            await asyncio.gather(*runners, return_exceptions=True)

    async def _watch_own_key(self, key: bytes, my_rev: int) -> None:
        async for _rev, _events in self.store.etcd.watch([(key, b"")], start_revision=my_rev + 1,
                                                         deletes_only=True):
            raise _LeaseLost("election key deleted")

    async def _supervise(self, task: LeaderTask, ctx: LeaderContext) -> None:
        """Run one leader task; restart it (after a pause) if it fails, while leader."""
        name = getattr(task, "__qualname__", repr(task))
        async for _ in Attempts(Deadline.never(), first_pause=1.0, max_pause=1.0):
            try:
                await task(ctx)
                return
            except (StoreUnavailable, E.LeaseNotFound) as exc:
                log.warning("leader task %s: %s; restarting", name, exc)
            except Exception:
                log.exception("leader task %s failed; restarting", name)
