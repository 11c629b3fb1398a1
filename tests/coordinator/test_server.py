"""Health, reflection, leader election with leader-only tasks, and the Reap hook."""
from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from baton.coordinator_client import CoordinatorClient
from baton_tools.testing.cluster import InProcessCoordinator, start_coordinator
from baton_tools.testing.servers import EtcdServer
from coordinator import CoordinatorConfig, CoordinatorServer, LeaderContext, parse_args
from tests.conftest import assert_eventually, unique


async def test_health_and_reflection(coord: InProcessCoordinator) -> None:
    async with grpc.aio.insecure_channel(coord.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for name in ("", "baton.v1.Coordinator"):
            r = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        call = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = set()
        async for resp in call:
            names |= {s.name for s in resp.list_services_response.service}
        assert {"baton.v1.Coordinator", "grpc.health.v1.Health"} <= names


async def test_config_from_env_and_flags() -> None:
    env = {"BATON_ETCD_ENDPOINTS": "a:1,b:2", "BATON_ETCD_PREFIX": "/p/", "BATON_DETACHED_RUN_TTL": "7",
           "BATON_COORDINATOR_ID": "c1"}
    cfg = CoordinatorConfig.from_env(env)
    assert cfg.etcd_endpoints == ("a:1", "b:2") and cfg.prefix == "/p/" and cfg.detached_run_ttl == 7.0
    cfg = parse_args(["--listen", "127.0.0.1:9", "--etcd", "c:3", "--detached-run-ttl", "9"], env)
    assert (cfg.listen, cfg.etcd_endpoints, cfg.detached_run_ttl, cfg.replica_id) == ("127.0.0.1:9", ("c:3",), 9.0, "c1")


async def test_reap_rpc_delegates_to_the_injected_reaper(etcd: EtcdServer) -> None:
    calls: list[tuple[float, float]] = []

    async def reaper(ttl: float, now: float) -> dict[str, int]:
        calls.append((ttl, now))
        return {"expired": 2, "producing": 1}

    h = await start_coordinator(etcd.endpoint, f"/{unique()}/", in_process=True, reaper=reaper,
                                detached_run_ttl=42.0)
    try:
        async with CoordinatorClient(h.address) as cc:
            assert await cc.reap(ttl=5, now=100) == {"expired": 2, "producing": 1}
            await cc.reap()
        assert calls[0] == (5.0, 100.0)
        assert calls[1][0] == 42.0 and calls[1][1] > 1e9       # configured TTL, coordinator clock
    finally:
        await h.stop()


async def test_default_reaper_reports_nothing(cc: CoordinatorClient) -> None:
    assert await cc.reap(ttl=1, now=1) == {}


async def test_one_leader_runs_leader_tasks_and_hands_over(etcd: EtcdServer) -> None:
    prefix = f"/{unique()}/"
    running: dict[str, int] = {}
    cancelled: list[str] = []

    def task_for(name: str):  # type: ignore[no-untyped-def]
        async def task(ctx: LeaderContext) -> None:
            assert ctx.replica_id == name
            await ctx.list_hosts()                        # the context works against etcd
            running[name] = running.get(name, 0) + 1
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(name)
                running[name] -= 1
                raise
        return task

    a = await start_coordinator(etcd.endpoint, prefix, in_process=True, replica_id="a", election_ttl=2.0,
                                leader_tasks=[task_for("a")])
    b = await start_coordinator(etcd.endpoint, prefix, in_process=True, replica_id="b", election_ttl=2.0,
                                leader_tasks=[task_for("b")])
    try:
        assert isinstance(a, InProcessCoordinator) and isinstance(b, InProcessCoordinator)
        await assert_eventually(lambda: sum(running.values()) == 1, timeout=10)
        leader, follower = (a, b) if running.get("a") else (b, a)
        assert leader.server.election.is_leader.is_set() and not follower.server.election.is_leader.is_set()
        lname = leader.config.replica_id
        fname = follower.config.replica_id
        await leader.stop()                               # graceful: steps down at once
        assert cancelled == [lname]
        await assert_eventually(lambda: running.get(fname) == 1, timeout=10)
        assert follower.server.election.is_leader.is_set()
    finally:
        await a.stop()
        await b.stop()


async def test_leader_crash_hands_over_after_the_lease_expires(etcd: EtcdServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A leader that dies without stepping down (SIGKILL) is replaced once its lease expires."""
    prefix = f"/{unique()}/"
    sub = await start_coordinator(etcd.endpoint, prefix, replica_id="sub", election_ttl=2.0, log_dir=tmp_path)
    # Wait for the subprocess to win: its candidate key is the only one.
    from coordinator._etcd import Etcd
    from coordinator._keys import Keys, prefix_end
    e = Etcd([etcd.endpoint])
    keys = Keys(prefix)

    async def candidates() -> list[bytes]:
        kvs, _ = await e.range(keys.election, prefix_end(keys.election), timeout=5, sort_by_create=True)
        return [kv.value for kv in kvs]
    try:
        await assert_eventually(lambda: _eq(candidates(), [b"sub"]), timeout=10)
        started = asyncio.Event()

        async def task(ctx: LeaderContext) -> None:
            started.set()
            await asyncio.Event().wait()
        inproc = await start_coordinator(etcd.endpoint, prefix, in_process=True, replica_id="inproc",
                                         election_ttl=2.0, leader_tasks=[task])
        try:
            await assert_eventually(lambda: _eq(candidates(), [b"sub", b"inproc"]), timeout=10)
            assert not started.is_set()
            await sub.kill()                                 # type: ignore[union-attr]
            async with asyncio.timeout(2.0 + 3.0):
                await started.wait()
        finally:
            await inproc.stop()
    finally:
        await sub.stop()
        await e.close()


async def _eq(aw, expected) -> bool:  # type: ignore[no-untyped-def]
    return (await aw) == expected


async def test_a_coordinator_started_before_etcd_turns_serving_once_etcd_answers(own_etcd: EtcdServer) -> None:
    own_etcd.stop()
    cfg = CoordinatorConfig().with_overrides(listen="127.0.0.1:0", etcd_endpoints=(own_etcd.endpoint,),
                                             prefix=f"/{unique()}/", replica_id=unique("c"), etcd_timeout=0.5)
    server = CoordinatorServer(cfg)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            health = health_pb2_grpc.HealthStub(ch)

            async def status() -> int:
                return (await health.Check(health_pb2.HealthCheckRequest(service="baton.v1.Coordinator"),
                                           timeout=5)).status

            assert await status() == health_pb2.HealthCheckResponse.NOT_SERVING
            own_etcd.start()

            async def serving() -> bool:
                return await status() == health_pb2.HealthCheckResponse.SERVING

            await assert_eventually(serving, timeout=30, interval=0.2)
    finally:
        await server.shutdown()
