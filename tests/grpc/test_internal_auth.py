"""Internal services refuse callers without the cluster's token (BATON_INTERNAL_TOKEN);
health and reflection stay open; a cluster whose parts share the token works end to end,
and the token appears in no log."""
from __future__ import annotations

import asyncio
import contextlib
import pathlib
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from baton import internal_auth
from baton.coordinator_client import CoordinatorClient
from baton.log import LogConfig
from baton.v1 import coordinator_pb2, coordinator_pb2_grpc, sandbox_host_pb2, sandbox_host_pb2_grpc
from baton.v1 import runs_service_pb2_grpc as pbg
from baton_tools.testing.cluster import start_coordinator, start_host
from tests.conftest import unique
from tests.gateway.conftest import host_settings
from tests.grpc.conftest import CHANNEL_OPTIONS, error_info, read_events, start_request


#: Field 1, 5 bytes long, 2 sent: protobuf cannot decode it.
CORRUPT = b"\x0a\x05ab"


async def _refused(call: Any) -> None:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
        assert error_info(exc).reason == "UNAUTHENTICATED"
        return
    raise AssertionError("the call was not refused")


async def _probes_open(address: str, service: str) -> None:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as ch:
        hc = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
        assert hc.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name async for r in refl for s in r.list_services_response.service]
        assert service in names and "grpc.health.v1.Health" in names


async def test_internal_services_need_the_token(etcd: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path,
                                                tmp_path: pathlib.Path, make_gateway: Any) -> None:
    token = f"tok-{unique()}-secret"
    coord = await start_coordinator(etcd.endpoint, f"/{unique('ia')}/", log_dir=tmp_path,
                                    BATON_INTERNAL_TOKEN=token, session_ttl=2)
    host = None
    try:
        host = await start_host(coord.address, nats.url, log_dir=tmp_path, BATON_INTERNAL_TOKEN=token,
                                **host_settings(log_cfg, replay_dir, tmp_path))
        # Without the token (or with a wrong one): UNAUTHENTICATED, on both services.
        for tok in ("", "wrong"):
            async with internal_auth.insecure_channel(coord.address, CHANNEL_OPTIONS, tok) as ch:
                stub = coordinator_pb2_grpc.CoordinatorStub(ch)
                await _refused(stub.ListHosts(coordinator_pb2.ListHostsRequest()))
                await _refused(stub.GetRun(coordinator_pb2.GetRunRequest(run_id="r")))
            async with internal_auth.insecure_channel(host.address, CHANNEL_OPTIONS, tok) as ch:
                hs = sandbox_host_pb2_grpc.SandboxHostStub(ch)
                await _refused(hs.CancelRun(sandbox_host_pb2.CancelRunRequest(run_id="r")))
                await _refused(hs.Drain(sandbox_host_pb2.DrainRequest()))
                # Bytes that do not parse: still UNAUTHENTICATED (the token comes first).
                await _refused(ch.unary_unary("/baton.v1.SandboxHost/CancelRun")(CORRUPT))
            async with internal_auth.insecure_channel(coord.address, CHANNEL_OPTIONS, tok) as ch:
                await _refused(ch.unary_unary("/baton.v1.Coordinator/GetRun")(CORRUPT))
        # With the token, bytes that do not parse are INVALID_ARGUMENT (grpcio said UNKNOWN).
        for address, method in ((coord.address, "/baton.v1.Coordinator/GetRun"),
                                (host.address, "/baton.v1.SandboxHost/CancelRun"),
                                (coord.address, "/grpc.health.v1.Health/Check")):
            async with internal_auth.insecure_channel(address, CHANNEL_OPTIONS, token) as ch:
                try:
                    await ch.unary_unary(method)(CORRUPT)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "is not a valid" in (exc.details() or "")
                else:
                    raise AssertionError(f"{method}: corrupt bytes were answered")
        # Health and reflection: open, on both.
        await _probes_open(coord.address, "baton.v1.Coordinator")
        await _probes_open(host.address, "baton.v1.SandboxHost")
        # With the token: served.
        async with internal_auth.insecure_channel(coord.address, CHANNEL_OPTIONS, token) as ch:
            hosts = await coordinator_pb2_grpc.CoordinatorStub(ch).ListHosts(coordinator_pb2.ListHostsRequest())
            assert [h.host_id for h in hosts.hosts] == [host.host_id]

        # The whole path (gateway → coordinator, gateway → host, host → coordinator) carries it.
        gw = await make_gateway(coordinator=(coord.address,), grpc_listen="127.0.0.1:0", internal_token=token)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.state.grpc_port}", options=CHANNEL_OPTIONS) as ch:
            got = await read_events(pbg.RunsStub(ch).StartRun(start_request(unique("th"), unique("run"))))
        assert got.error is None and got.end == "completed"
        assert "".join(c.get("delta", "") for c in got.json()) == "hello from the replay"
    finally:
        if host is not None:
            await host.stop()
        await coord.stop()
    for f in tmp_path.rglob("*.log"):
        assert token not in f.read_text(errors="replace"), f


async def test_streaming_internal_calls_carry_the_token(etcd: Any, tmp_path: pathlib.Path) -> None:
    """Keep-alive streams (stream-stream) and run watches (unary-stream) carry the token too.

    grpc.aio files a client interceptor under the first call kind it implements, so one
    interceptor object for all kinds sent the token on unary calls only: every session of a
    cluster with a token was lost after one TTL, and watches were refused.
    """
    token = f"tok-{unique()}-secret"
    coord = await start_coordinator(etcd.endpoint, f"/{unique('ia')}/", log_dir=tmp_path,
                                    BATON_INTERNAL_TOKEN=token, session_ttl=1)
    client = CoordinatorClient(coord.address, token=token)
    try:
        session = await client.open_session(ttl=1.0, owner="auth-test")
        # Observed over three TTLs, during which only the keep-alive stream can hold the
        # lease: the session is never lost.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(3 * session.ttl + 0.5):
                await session.lost.wait()
        assert not session.lost.is_set()
        async with asyncio.timeout(10):
            event = await anext(aiter(client.watch_run(unique("run"))))
        assert event.record is None
        await session.close()
        # And a keep-alive without the token is refused, not silently accepted.
        async with internal_auth.insecure_channel(coord.address, CHANNEL_OPTIONS, "") as ch:
            # No request is sent: the refusal comes from the call's metadata, and a request
            # written while it arrives (even from an iterator) can make grpc end the call
            # INTERNAL ("Failed execute_batch": seen in CI) instead of with the refusal.
            call = coordinator_pb2_grpc.CoordinatorStub(ch).KeepAlive(iter([]))
            await _refused(call.read())
    finally:
        await client.close()
        await coord.stop()


async def test_the_token_goes_out_on_every_kind_of_call() -> None:
    """Streams too: grpc.aio files an interceptor object under one call kind only, so the
    session keep-alive (a stream-stream call) once went out without the token and every
    host's session was lost within its TTL wherever a token was set (compose, Kubernetes)."""
    seen: list[str] = []

    def token(context: Any) -> bytes:
        got = dict(context.invocation_metadata()).get(internal_auth.TOKEN_METADATA, "<none>")
        seen.append(got)
        return got.encode()  # type: ignore[no-any-return]

    async def uu(request: bytes, context: Any) -> bytes:
        return token(context)

    async def us(request: bytes, context: Any) -> Any:
        yield token(context)

    async def su(requests: Any, context: Any) -> bytes:
        async for _ in requests:
            pass
        return token(context)

    async def ss(requests: Any, context: Any) -> Any:
        async for _ in requests:
            yield token(context)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {
        "UU": grpc.unary_unary_rpc_method_handler(uu), "US": grpc.unary_stream_rpc_method_handler(us),
        "SU": grpc.stream_unary_rpc_method_handler(su), "SS": grpc.stream_stream_rpc_method_handler(ss),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    secret = unique("tok")
    ch = internal_auth.insecure_channel(f"127.0.0.1:{port}", (), secret)
    try:
        assert await ch.unary_unary("/t.T/UU")(b"x") == secret.encode()
        assert [r async for r in ch.unary_stream("/t.T/US")(b"x")] == [secret.encode()]

        async def one() -> Any:
            yield b"x"
        assert await ch.stream_unary("/t.T/SU")(one()) == secret.encode()
        # The keep-alive's way: a stream-stream call written to, without a request
        # iterator, more than once (later writes must work too).
        call = ch.stream_stream("/t.T/SS")()
        for _ in range(3):
            await call.write(b"x")
            assert await call.read() == secret.encode()
        await call.done_writing()
        assert seen == [secret] * 6
    finally:
        await ch.close()
        await server.stop(0)
