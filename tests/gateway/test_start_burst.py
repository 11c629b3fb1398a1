"""Many starts at once on hosts slower than the gateway's per-call deadline.

Under load a ``StartRun`` (3 coordinator calls, 3 JetStream appends) can take longer than the
gateway's per-call deadline. The host is busy, not dead: the gateway asks it again (the
retry awaits the start in flight there) instead of trying every host and answering
``NO_HOST_AVAILABLE``. Here the deadline is made shorter than one start (real coordinator,
two real hosts, real etcd/NATS), so most starts of a burst outlive it. What a user checks:
every POST is served from the run's start to its end, every run ran exactly once (epoch 1,
``RUN_STARTED`` and ``run.accepted`` once, offsets without gap or repeat, completed), and
its transcript holds its input. A host that is gone (no longer registered) is not asked again.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import pathlib
import types
from typing import Any, AsyncIterator

import httpx
import pytest

from baton import errors as e
from baton.coordinator_client import CoordinatorClient, RunView
from baton.log import DeliveryLog, LogConfig
from baton.retry import Deadline
from baton.v1 import coordinator_pb2, runs_pb2, sandbox_host_pb2
from baton_tools.testing.cluster import start_coordinator, start_host
from gateway._service import _start
from gateway._hosts import HostTimedOut
from tests.conftest import unique
from tests.gateway.conftest import host_settings, read_stream
from tests.gateway.test_start_atomicity import assert_started_with_input, chat_body, log_chunks

RUNS = 16
#: Shorter than one start of a burst (seconds), so the gateway's retry path is taken.
SHORT_RPC_TIMEOUT = 0.05


@pytest.fixture
async def two_hosts(etcd: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path,
                    tmp_path: pathlib.Path) -> AsyncIterator[dict[str, Any]]:
    coord = await start_coordinator(etcd.endpoint, f"/{unique('sb')}/", log_dir=tmp_path,
                                    detached_run_ttl=3600, reaper_interval=0)
    settings = host_settings(log_cfg, replay_dir, tmp_path)
    hosts = [await start_host(coord.address, nats.url, log_dir=tmp_path, **settings) for _ in range(2)]
    cc = CoordinatorClient(coord.address)
    dlog = await DeliveryLog.connect(nats.url, log_cfg)
    try:
        yield {"coord": coord, "cc": cc, "log": dlog, "cfg": log_cfg}
    finally:
        await asyncio.gather(*(h.stop() for h in hosts))
        await cc.close()
        await dlog.close()
        await coord.stop()


@pytest.mark.timeout(240)
async def test_a_burst_of_starts_slower_than_the_deadline_all_run_exactly_once(
        two_hosts: dict[str, Any], make_gateway: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    p = two_hosts
    cc: CoordinatorClient = p["cc"]
    monkeypatch.setattr(_start, "RPC_TIMEOUT", SHORT_RPC_TIMEOUT)
    # The budget is not under test: on a machine at ten times its cores, 16 starts asked
    # again every 50 ms took past the shipped 60 s and the gateway answered 503.
    monkeypatch.setattr(_start, "START_BUDGET", 180.0)
    gw = await make_gateway(coordinator=(p["coord"].address,))
    runs = [(unique("run-"), unique("thr-")) for _ in range(RUNS)]
    with caplog.at_level(logging.INFO, logger="gateway.start"):
        async with httpx.AsyncClient(trust_env=False, timeout=120) as http:
            streams = await asyncio.gather(*(
                read_stream(http, "POST", f"{gw.url}/api/chat", json=chat_body(run_id, thread_id, f"hi {i}"))
                for i, (run_id, thread_id) in enumerate(runs)))
    # The path under test was taken: some start outlived the deadline and was asked again.
    assert any("asking it again" in r.getMessage() for r in caplog.records)
    for (run_id, thread_id), s, i in zip(runs, streams, range(RUNS)):
        assert s.status == 200 and s.ended, (run_id, s.status)
        await assert_started_with_input(p, run_id, thread_id, f"hi {i}")
        # Served from the run's start to its end, each chunk once, in order.
        offsets = [int(off or -1) for off, _ in s.events]
        assert offsets == sorted(set(offsets))
        async with asyncio.timeout(30):
            stored = await log_chunks(p["log"], run_id)
        assert [c for _, c in s.events] == stored
        assert [c["type"] for _, c in s.events] == [c["type"] for _, c in streams[0].events]
        assert (await cc.get_run(run_id)).record.driver_epoch == 1  # one start, one agent


HOST = coordinator_pb2.HostInfo(host_id="h", address="h:1")


class _State:
    def __init__(self, pool: "_Pool") -> None:
        self.hosts = pool


def _slow(answers: int, registered: bool) -> "_Pool":
    """:data:`HOST`, not answering ``answers`` times, then answering; gone unless ``registered``."""
    return _Pool({HOST.address: ["timeout"] * answers + ["ok"]}, gone=() if registered else (HOST.address,))
REQ = sandbox_host_pb2.StartRunRequest(run_id="r")


async def test_a_live_host_that_is_slow_is_asked_again_until_it_answers() -> None:
    hosts = _slow(3, registered=True)
    resp = await _start.start_on(_State(hosts), HOST, REQ, Deadline.after(60))  # type: ignore[arg-type]
    assert resp.created and hosts.calls[HOST.address] == 4


async def test_a_host_gone_from_the_registry_is_not_asked_again() -> None:
    hosts = _slow(3, registered=False)
    with pytest.raises(HostTimedOut):
        await _start.start_on(_State(hosts), HOST, REQ, Deadline.after(60))  # type: ignore[arg-type]
    assert hosts.calls[HOST.address] == 1


async def test_a_start_past_its_budget_is_not_asked_again() -> None:
    hosts = _slow(3, registered=True)
    with pytest.raises(e.StoreUnavailable):
        await _start.start_on(_State(hosts), HOST, REQ, Deadline.after(0))  # type: ignore[arg-type]
    assert hosts.calls[HOST.address] == 1


class _Coordinator:
    """The run's record as the coordinator answers ``GetRun`` (``None``: unknown run)."""

    def __init__(self, record: runs_pb2.RunRecord | None) -> None:
        self.record, self.lookups = record, 0

    async def get_run(self, run_id: str, *, timeout: float | None = None) -> RunView:
        self.lookups += 1
        if self.record is None:
            raise e.UnknownRun(run_id)
        return RunView(self.record, None, None)


class _Pool:
    """The host pool as :func:`gateway._hosts.try_hosts` and ``start_on`` use it: each host
    answers its calls from a script (``"timeout"``, ``"full"``, ``"ok"``; the last repeats)."""

    def __init__(self, scripts: dict[str, list[str]], gone: tuple[str, ...] = ()) -> None:
        self.scripts, self.gone = scripts, gone
        self.in_flight: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def rank(self, hosts: list[coordinator_pb2.HostInfo]) -> list[coordinator_pb2.HostInfo]:
        return hosts

    def note_handed(self, host_id: str) -> None:
        pass

    async def call(self, address: str, method: str, request: Any, timeout: float) -> Any:
        script = self.scripts[address]
        answer = script[min(self.calls[address], len(script) - 1)]
        self.calls[address] += 1
        if answer == "timeout":
            raise HostTimedOut("DEADLINE_EXCEEDED")
        if answer == "full":
            raise e.HostAtCapacity(address, 1)
        return sandbox_host_pb2.StartRunResponse(created=True, record=runs_pb2.RunRecord(run_id="r"))

    async def registered(self, host: coordinator_pb2.HostInfo, timeout: float | None = None) -> bool:
        return host.address not in self.gone


class _Counter:
    def labels(self, *_: str) -> "_Counter":
        return self

    def inc(self) -> None:
        pass


class _Takeovers:
    def __init__(self) -> None:
        self.considered: list[str] = []

    def consider(self, run_id: str, record: Any, claim: Any) -> None:
        self.considered.append(run_id)


class _AdmittedState:
    def __init__(self, pool: _Pool, coordinator: _Coordinator) -> None:
        self.hosts, self.coordinator, self.takeovers = pool, coordinator, _Takeovers()
        self.metrics = types.SimpleNamespace(appends=_Counter())


def _hosts(*names: str) -> list[coordinator_pb2.HostInfo]:
    return [coordinator_pb2.HostInfo(host_id=n, address=n) for n in names]


STARTED = runs_pb2.RunRecord(run_id="r", thread_id="t", status=runs_pb2.RUN_STATUS_COMPLETED, driver_host="a")


@pytest.mark.parametrize("scripts, gone", [
    ({"a": ["timeout", "full"]}, ()),  # asked again, full: its unanswered start took the last slot
    ({"a": ["timeout"], "b": ["full"]}, ("a",)),  # a gone after the timeout, b full
], ids=["full when asked again", "gone, then the next full"])
async def test_a_start_that_every_host_failed_after_an_unanswered_ask_joins_the_run_it_began(
        scripts: dict[str, list[str]], gone: tuple[str, ...]) -> None:
    """The start a host did not answer in time went on and started the run (here it even
    ended): the client is served that run, not told ``503`` while it goes on without it."""
    cc = _Coordinator(STARTED)
    state = _AdmittedState(_Pool(scripts, gone), cc)
    record = await _start._start_admitted(state, REQ, _hosts(*scripts))  # type: ignore[arg-type]
    assert record == STARTED and cc.lookups == 1
    assert state.takeovers.considered == ["r"]  # its host may be the one gone: a takeover if due


@pytest.mark.parametrize("record", [None, runs_pb2.RunRecord(run_id="r", thread_id="t", starting=True)],
                         ids=["no run", "still starting"])
async def test_a_start_failed_everywhere_after_an_unanswered_ask_is_refused_when_the_run_did_not_start(
        record: runs_pb2.RunRecord | None) -> None:
    cc = _Coordinator(record)
    with pytest.raises(e.HostAtCapacity):
        await _start._start_admitted(_AdmittedState(_Pool({"a": ["timeout", "full"]}), cc), REQ,  # type: ignore[arg-type]
                                     _hosts("a"))
    assert cc.lookups == 1


async def test_hosts_full_at_the_first_ask_are_a_refusal_with_no_lookup() -> None:
    cc = _Coordinator(STARTED)
    pool = _Pool({"a": ["full"], "b": ["full"]})
    with pytest.raises(e.HostAtCapacity):
        await _start._start_admitted(_AdmittedState(pool, cc), REQ, _hosts("a", "b"))  # type: ignore[arg-type]
    assert cc.lookups == 0 and pool.calls == {"a": 1, "b": 1}
