"""Fixtures of the gRPC API tests: the gateway fixtures (real coordinator, NATS, sandbox
hosts) plus a gateway serving ``baton.v1.Runs`` on a free port, and helpers to read its
streams the way a client would."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, AsyncIterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from baton.v1 import runs_pb2, runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
# The gateway suite's fixtures: one coordinator, delivery-log stream and replay dir per session.
from tests.gateway.conftest import (  # noqa: F401
    Gateway, cc, coordinator, dlog, host, http, log_cfg, make_gateway, read_stream, replay_dir,
)

CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]


def agent(journal: str = "claude-stream-json/hello.jsonl", **opts: Any) -> runs_pb2.AgentSpec:
    return runs_pb2.AgentSpec(kind="replay", options_json=json.dumps({"journal": journal, **opts}))


def start_request(thread: str, run: str, **kw: Any) -> pb.RunStartRequest:
    kw.setdefault("agent", agent())
    return pb.RunStartRequest(thread_id=thread, run_id=run,
                              messages_json=json.dumps([{"id": "u1", "role": "user", "content": "go"}]), **kw)


@dataclasses.dataclass
class Read:
    """What one stream delivered."""

    chunks: list[tuple[str, bytes]]
    end: str | None        # the close status when the log closed
    gap: str | None        # earliest offset when the offset had expired
    error: grpc.aio.AioRpcError | None
    keepalives: int = 0

    def json(self) -> list[dict[str, Any]]:
        return [json.loads(c) for _, c in self.chunks]


async def read_events(call: Any, stop_after: int | None = None) -> Read:
    """Read a StartRun/JoinRun stream to its end (or ``stop_after`` chunks, then cancel)."""
    out = Read([], None, None, None)
    try:
        async for ev in call:
            for c in ev.chunks:
                out.chunks.append((c.offset, c.json))
            if ev.HasField("end"):
                out.end = ev.end.status
            elif ev.HasField("gap"):
                out.gap = ev.gap.earliest_offset
            elif not ev.chunks:
                out.keepalives += 1
            if stop_after is not None and len(out.chunks) >= stop_after:
                call.cancel()
                break
    except grpc.aio.AioRpcError as exc:
        out.error = exc
    return out


def error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ``ErrorInfo`` detail of a failed call (asserts there is one)."""
    status = rpc_status.from_call(err)
    assert status is not None, err
    for d in status.details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            return info
    raise AssertionError(f"no ErrorInfo in {err}")


async def sse_chunks(http: Any, url: str, run_id: str, headers: dict[str, str] | None = None
                     ) -> tuple[list[tuple[str, bytes]], bool]:
    """``(offset, data bytes)`` of the whole SSE join of a run, raw off the wire, and whether
    the end marker arrived."""
    out: list[tuple[str, bytes]] = []
    ended = False
    offset = ""
    async with http.stream("GET", f"{url}/api/chat", params={"runId": run_id, "offset": "-1"},
                           headers=headers or {}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("id: "):
                offset = line[4:]
            elif line.startswith("data: "):
                out.append((offset, line[6:].encode()))
            elif line == ": end":
                ended = True
    return out, ended


@pytest.fixture
async def grpc_gateway(make_gateway: Any) -> Gateway:
    return await make_gateway(keepalive=0.5, grpc_listen="127.0.0.1:0")


@pytest.fixture
async def channel(grpc_gateway: Gateway) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_gateway.state.grpc_port}",
                                         options=CHANNEL_OPTIONS) as ch:
        yield ch


@pytest.fixture
def runs(channel: grpc.aio.Channel) -> pbg.RunsStub:
    return pbg.RunsStub(channel)


async def kill_driver_mid_run(cc: Any, dlog: Any, hosts: list[Any], run_id: str, after_chunks: int,
                              timeout: float = 60) -> str:
    """SIGKILL the host driving ``run_id`` once its log holds ``after_chunks`` chunks.

    Returns:
        The killed host's id.
    """
    import asyncio

    from baton import errors as e

    seen = 0
    async with asyncio.timeout(timeout):
        while True:
            try:
                await cc.get_run(run_id)
                break
            except e.UnknownRun:  # not created yet
                await asyncio.sleep(0.02)
        async with dlog.read(run_id, after="-1") as reader:
            async for _offset, _chunk in reader:
                seen += 1
                if seen >= after_chunks:
                    break
        view = await cc.get_run(run_id)
        assert view.claim is not None, "the run is not driven by anyone"
        victim = next(h for h in hosts if h.host_id == view.claim.host_id)
        await victim.kill()
        return str(victim.host_id)
