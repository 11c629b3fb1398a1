"""A host that lost its session while one of its drivers still ran gets the run back.

What the 200-run bench left behind (``bench/results/scale_runs.json``, replicated side: r141
and r142 never ended): records ``running``, no longer ``starting``, epoch 1, no claim, no
sandbox; logs with the epoch-1 fence, ``RUN_STARTED`` and ``run.accepted`` only. Their host
(h1) lost its session while it was starting them. The failover handed each orphan to the
least loaded host, h1 itself (it had just lost every claim), while h1 still ran a driver of
the run that no longer held its claim; h1 answered ``held`` from that driver, the failover
took that for "driven" and never offered the run again, and the driver then stopped on its
lost claim. Two ways to that stale driver:

* the start was in flight when the session was lost: its clear of ``starting`` landed
  before the lease lapsed in etcd, and the host spawned the driver after it had told its
  drivers to stop, so that one never heard it;
* a driver slow to stop after its session was lost (a body that swallows a cancel, as a
  client library's ``wait_for`` does on Python 3.11; ``ignored a cancel`` in the bench's
  host logs).

A third way to a run nobody drives, also under that load: a start whose input was durable
but whose clear of ``starting`` and release the store did not answer, its session lost in
the host's eyes while etcd still held the lease; the retried start met the old claim
(``held``) and joined it at once, and once the lease lapsed nobody drove the ``starting``
run (the reaper would abort it a minute later).

The host here runs in the test's process (real coordinator with its failover, etcd and
nats-server, the local provider and the replay agent) so each step happens in that order
every time: the driver of epoch 1 is held where it registers its sandbox until the
failover's ``AttachRun`` of the run was answered, and the session's loss is what a host
does when its lease lapses (revoked in etcd, drivers told, a new session registered).
What a user checks: the run ends ``completed`` by a successor, and a reader from the start
got the exact chunk sequence of the run, each chunk once.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
from dataclasses import dataclass
from typing import Any, AsyncIterator

import grpc
import pytest

from baton.coordinator_client import Session
from baton.errors import StoreUnavailable
from baton.v1 import coordinator_pb2, runs_pb2, sandbox_host_pb2
from sandbox_host.deps import HostDeps, HostSettings
from sandbox_host.machine import accepted_chunk
from sandbox_host.manager import RunManager
from sandbox_host.providers import provider_for
from sandbox_host.service import SandboxHostService, add_to_server
from sandbox_host.translate import translate_bytes
from tests.conftest import assert_eventually, unique
from tests.driver.conftest import CORPUS, Cluster, make_cluster

SHORT = "codex-exec-json/zsh-commands-and-file-change.jsonl"
USER = [{"id": "u1", "role": "user", "content": "replay it"}]
TTL = 2.0


class _Coordinator:
    """The host's coordinator client, with two marks for the test: the start's clear of
    ``starting`` is held once it landed (until ``go``), and a claim above epoch 1 releases
    the held driver (``on_successor``)."""

    def __init__(self, cc: Any, on_successor: asyncio.Event) -> None:
        self._cc = cc
        self._on_successor = on_successor
        self.hold_clear = False
        self.cleared = asyncio.Event()
        self.go = asyncio.Event()
        #: The store answers neither the clear of ``starting`` nor a release (a slow etcd
        #: under load: the calls time out), while this is set.
        self.slow_store = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cc, name)

    async def update_run(self, run_id: str, record: runs_pb2.RunRecord, paths: Any, **kw: Any) -> Any:
        # The start's clear of ``starting`` (it names the sandbox's provider in the same write).
        clear = "starting" in paths
        if self.slow_store and clear:
            raise StoreUnavailable("UpdateRun: deadline exceeded")
        out = await self._cc.update_run(run_id, record, paths, **kw)
        if self.hold_clear and clear:
            self.cleared.set()
            await self.go.wait()
        return out

    async def release_claim(self, *args: Any, **kw: Any) -> Any:
        if self.slow_store:
            raise StoreUnavailable("ReleaseClaim: deadline exceeded")
        return await self._cc.release_claim(*args, **kw)

    async def claim_run(self, *args: Any, **kw: Any) -> Any:
        epoch, record = await self._cc.claim_run(*args, **kw)
        if epoch > 1:
            self._on_successor.set()
        return epoch, record


class _HeldDeps(HostDeps):
    """Host deps whose epoch-1 driver waits where it registers its sandbox until ``release``
    (a successor claimed, or the failover's ``AttachRun`` was answered), swallowing every
    cancel meanwhile: a driver slow to stop."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = asyncio.Event()
        self.held = asyncio.Event()

    async def register_sandbox(self, record: runs_pb2.RunRecord, sbx: Any, *, launched: bool, epoch: int) -> None:
        if epoch == 1:
            self.held.set()
            while not self.release.is_set():
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    pass
        await super().register_sandbox(record, sbx, launched=launched, epoch=epoch)


class _Manager(RunManager):
    """Releases the held driver once an ``AttachRun`` was answered (refused or not)."""

    async def attach_run(self, run_id: str, purpose: str = "drive") -> Any:
        try:
            return await super().attach_run(run_id, purpose)
        finally:
            assert isinstance(self.deps, _HeldDeps)
            self.deps.release.set()


@dataclass
class _Host:
    host_id: str
    deps: _HeldDeps
    coordinator: _Coordinator
    manager: _Manager
    server: grpc.aio.Server
    address: str

    async def register(self) -> None:
        await self.coordinator.register_host(coordinator_pb2.HostInfo(
            host_id=self.host_id, address=self.address, capacity=8, provider_kinds=["local"],
            session_id=self.deps.session.id, load=self.manager.load))

    async def lose_session(self) -> None:
        """What a host does when its lease lapsed: the lease is gone in etcd (its claims and
        its registry entry with it), its drivers are told, it opens a new session. It
        registers again only when the test says so (:meth:`register`)."""
        old = self.deps.session
        await old.close()  # revoked: as the lease's expiry, at once
        self.manager.session_lost()
        self.deps.session = await self.coordinator.open_session(ttl=TTL, owner=self.host_id)


@pytest.fixture
async def host(etcd: Any, nats: Any, tmp_path: pathlib.Path) -> AsyncIterator[tuple[Cluster, _Host]]:
    c = await make_cluster(etcd, nats, tmp_path, hosts=0)
    host_id = unique("inproc-")
    successor = asyncio.Event()
    coordinator = _Coordinator(c.cc, successor)
    session = await c.cc.open_session(ttl=TTL, owner=host_id)
    provider = provider_for("local", base_dir=str(tmp_path / "sandboxes"), journal_dir=str(tmp_path / "journals"))
    deps = _HeldDeps(host_id=host_id, cc=coordinator, session=session, log=c.log, transcripts=c.transcripts,
                     providers={"local": provider}, settings=HostSettings(cancel_grace=1.0, final_write_timeout=5.0))
    deps.release = successor
    manager = _Manager(deps)
    server = grpc.aio.server()
    add_to_server(SandboxHostService(manager, manager.drain), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    h = _Host(host_id, deps, coordinator, manager, server, f"127.0.0.1:{port}")
    try:
        await h.register()
        yield c, h
    finally:
        deps.release.set()
        coordinator.go.set()
        await manager.shutdown()
        await server.stop(None)
        await deps.session.close()
        await session.close()
        await c.close()


def _start_request(run_id: str, thread_id: str) -> sandbox_host_pb2.StartRunRequest:
    opts = {"journal": str(CORPUS / SHORT), "speed": 0, "delay": 0}
    return sandbox_host_pb2.StartRunRequest(
        run_id=run_id, thread_id=thread_id, messages_json=json.dumps(USER),
        agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(opts)))


async def _assert_completed_by_successor(c: Cluster, h: _Host, run_id: str, thread_id: str) -> None:
    got = await c.read_all(run_id, timeout=45)
    chunks = [ch for _, ch in got]
    journal = translate_bytes("codex-exec-json", (CORPUS / SHORT).read_bytes(), run_id, thread_id)
    # The run's log: RUN_STARTED, the host's run.accepted, then the rest of the journal's
    # chunks: exactly once each, in order (a reader connected the whole time).
    assert chunks[1] == accepted_chunk(run_id, thread_id, "replay", USER)
    assert chunks[:1] + chunks[2:] == journal
    done = await c.wait_status(run_id, "completed")
    assert done.driver_epoch == 2 and done.driver_host == h.host_id

    async def released() -> bool:
        assert (await c.cc.get_run(run_id)).claim is None  # released after the status
        return True
    await assert_eventually(released, timeout=30)


@pytest.mark.timeout(120)
async def test_a_start_that_outlived_its_session_is_taken_over(host: tuple[Cluster, _Host]) -> None:
    c, h = host
    run_id, thread_id = unique("run-"), unique("thr-")
    h.coordinator.hold_clear = True
    start = asyncio.create_task(h.manager.start_run(_start_request(run_id, thread_id)))
    async with asyncio.timeout(30):
        await h.coordinator.cleared.wait()  # the input is durable, starting cleared
    await h.lose_session()  # the claim goes with the lease; the failover finds no host yet
    h.coordinator.go.set()  # the start goes on, under a session that is gone
    async with asyncio.timeout(30):
        record, created = await start
    assert created and not record.starting
    await h.register()  # back: the failover hands the orphan to this host
    await _assert_completed_by_successor(c, h, run_id, thread_id)


@pytest.mark.timeout(120)
async def test_a_driver_slow_to_stop_after_its_session_was_lost_does_not_keep_the_run(
        host: tuple[Cluster, _Host]) -> None:
    c, h = host
    run_id, thread_id = unique("run-"), unique("thr-")
    record, created = await h.manager.start_run(_start_request(run_id, thread_id))
    assert created and not record.starting
    async with asyncio.timeout(30):
        await h.deps.held.wait()  # the driver registers its sandbox
    await h.lose_session()  # told to stop, it is still stopping
    await h.register()
    await _assert_completed_by_successor(c, h, run_id, thread_id)


@pytest.mark.timeout(120)
async def test_a_retried_start_takes_over_a_start_whose_session_lapsed_after_its_input_was_durable(
        host: tuple[Cluster, _Host]) -> None:
    # The other way the bench's overloaded host could leave a run: its start made the input
    # durable, then the store did not answer the clear of ``starting`` nor the release, and
    # its session was lost in the host's eyes (no refresh answered for a TTL) while etcd still
    # held the lease (the refreshes reached it). The gateway's retry of the start (here on the
    # same host, under its new session) meets the old claim, ``held``; joining it at once left
    # the run ``starting`` with nobody to drive it once the lease lapsed (failover leaves
    # starting runs to their start; the reaper, off here, would abort it after a minute).
    c, h = host
    run_id, thread_id = unique("run-"), unique("thr-")
    first = h.deps.session
    h.coordinator.slow_store = True
    start = asyncio.create_task(h.manager.start_run(_start_request(run_id, thread_id)))

    async def input_durable() -> bool:
        got = [(r.kind, r.origin) for r in await c.log.stored_headers(run_id)]
        assert [o for k, o in got if k == "chunk"] == ["journal", "host"], got
        return True
    await assert_eventually(input_durable, timeout=30, interval=0.05)
    # The host sees its session lost; etcd keeps the lease (refreshed from here) until later.
    keeper = Session(c.cc, first.id, TTL, "refreshes-that-reached-etcd")
    try:
        first._task.cancel()
        with pytest.raises(StoreUnavailable):
            async with asyncio.timeout(30):
                await start
        h.coordinator.slow_store = False
        h.manager.session_lost()
        h.deps.session = await h.coordinator.open_session(ttl=TTL, owner=h.host_id)
        await h.register()
        retry = asyncio.create_task(h.manager.start_run(_start_request(run_id, thread_id)))
        view = await c.cc.get_run(run_id)
        assert view.record.starting and view.claim is not None and view.claim.session_id == first.id
    finally:
        await keeper.close()  # the lease lapses: the old claim goes
    async with asyncio.timeout(60):
        await retry
    await _assert_completed_by_successor(c, h, run_id, thread_id)
