"""The gateway process runs on the event loop ``BATON_EVENT_LOOP`` names (uvloop by default,
as the coordinator), and serves its HTTP and gRPC APIs on it; an unknown loop is refused."""
from __future__ import annotations

from typing import Any

import grpc
import httpx
import pytest

from baton.v1 import runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
from baton_tools.testing.cluster import start_gateway
from baton_tools.testing.servers import free_port
from tests.conftest import unique


@pytest.mark.parametrize("loop, loop_class", [("uvloop", "uvloop.Loop"), ("asyncio", "_UnixSelectorEventLoop")])
async def test_the_gateway_serves_http_and_grpc_on_the_configured_loop(
        loop: str, loop_class: str, coordinator: Any, nats: Any, tmp_path: Any) -> None:
    grpc_port = free_port()
    gw = await start_gateway(coordinator.address, nats.url, log_dir=tmp_path, log_level="INFO",
                             event_loop=loop, gateway_grpc_listen=f"127.0.0.1:{grpc_port}")
    try:
        assert f"event loop: {loop_class}" in gw.log_path.read_text().replace("asyncio.unix_events.", "")
        async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
            name = unique("loop")
            assert (await http.put(f"{gw.url}/ds/{name}", headers={"content-type": "text/plain"})).status_code == 201
            appended = await http.post(f"{gw.url}/ds/{name}", headers={"content-type": "text/plain"}, content=b"hi")
            assert appended.status_code == 204
            read = await http.get(f"{gw.url}/ds/{name}", params={"offset": "-1"})
            assert read.content == b"hi"
            assert read.headers["stream-next-offset"] == appended.headers["stream-next-offset"]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.enable_http_proxy", 0)]) as ch:
            agents = await pbg.RunsStub(ch).ListAgents(pb.AgentListRequest(), timeout=30)
        assert agents.default_kind == "replay"
        assert "replay" in {a.kind for a in agents.agents}
    finally:
        await gw.stop()
