"""A gateway of 2 worker processes on one port (``BATON_GATEWAY_WORKERS=2``): SSE, gRPC and
``/ds`` are all served; a reader that reconnects and lands on the other worker resumes
exactly once from its ``Last-Event-ID``; a SIGKILLed worker is replaced and its readers
resume; SIGTERM to the supervisor stops every worker."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from typing import Any, AsyncIterator

import grpc
import httpx
import pytest

from baton.log import DeliveryLog, LogConfig
from baton.sse import Comment, aiter_sse
from baton.v1 import runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
from baton_tools.testing.cluster import GatewayProcess, start_gateway
from baton_tools.testing.servers import free_port, free_ports_in_a_row
from tests.conftest import assert_eventually, unique
from tests.grpc.conftest import read_events
from tests.gateway.conftest import run_chunks, write_run

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

_STARTED = re.compile(r"gateway worker (\d+)/2 started \(pid (\d+)\)")


def _metrics_base() -> int:
    """A port P with P and P + 1 free and never handed out again: worker i serves its
    metrics on P + i."""
    return free_ports_in_a_row(2)


class Workers:
    """The gateway under test and what tells its workers apart (metrics port, pid)."""

    def __init__(self, gw: GatewayProcess, metrics: int, grpc_port: int) -> None:
        self.gw, self.metrics, self.grpc_port = gw, metrics, grpc_port

    def pids(self) -> dict[int, int]:
        """Worker index → its latest pid, from the supervisor's log."""
        return {int(i): int(pid) for i, pid in _STARTED.findall(self.gw.log_text())}

    async def readers(self, http: httpx.AsyncClient, index: int) -> int:
        text = (await http.get(f"http://127.0.0.1:{self.metrics + index}/metrics")).text
        m = re.search(r"^baton_gateway_readers ([0-9.]+)$", text, re.M)
        return int(float(m.group(1))) if m else 0

    async def serving(self, http: httpx.AsyncClient) -> int:
        """The index of the worker holding the one open reader."""
        async def which() -> int | None:
            counts = [await self.readers(http, i) for i in (0, 1)]
            return counts.index(1) if sorted(counts) == [0, 1] else None

        found: list[int] = []

        async def one() -> bool:
            w = await which()
            if w is not None:
                found.append(w)
            return w is not None
        await assert_eventually(one, timeout=30)
        return found[-1]


@pytest.fixture
async def workers(coordinator: Any, nats: Any, log_cfg: LogConfig, tmp_path: Any) -> AsyncIterator[Workers]:
    metrics, grpc_port = _metrics_base(), free_port()
    gw = await start_gateway(coordinator.address, nats.url, log_dir=tmp_path, log_level="INFO",
                             gateway_workers=2, gateway_grpc_listen=f"127.0.0.1:{grpc_port}",
                             gateway_metrics_listen=f"127.0.0.1:{metrics}", runs_stream=log_cfg.stream,
                             subject_prefix=log_cfg.subject_prefix, threads_bucket=log_cfg.bucket,
                             sse_keepalive=0.5, start_timeout=120)
    w = Workers(gw, metrics, grpc_port)
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            async def both_up() -> bool:
                try:
                    codes = [(await http.get(f"http://127.0.0.1:{metrics + i}/metrics")).status_code for i in (0, 1)]
                    return len(w.pids()) == 2 and codes == [200, 200]
                except httpx.TransportError:
                    return False
            await assert_eventually(both_up, timeout=60)
        yield w
    finally:
        await gw.stop(timeout=30)


@contextlib.asynccontextmanager
async def _sse(url: str, run_id: str, last_event_id: str | None = None) -> AsyncIterator[Any]:
    """An SSE read of a run on a connection of its own (a new source port: the kernel may
    hand it to either worker); yields an async iterator of ``(id, chunk)``, ``None`` at the end."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    params = {"runId": run_id} if last_event_id else {"runId": run_id, "offset": "-1"}
    async with httpx.AsyncClient(trust_env=False, timeout=30) as own, \
            own.stream("GET", f"{url}/api/chat", params=params, headers=headers) as resp:
        assert resp.status_code == 200, resp.status_code

        async def events() -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
            async for item in aiter_sse(resp.aiter_bytes()):
                if isinstance(item, Comment):
                    if item.text == "end":
                        yield None
                        return
                    continue
                yield item.id, json.loads(item.data)
        yield events()


async def _take(events: Any, n: int) -> list[tuple[str, dict[str, Any]]]:
    got = []
    async for ev in events:
        assert ev is not None, "the stream ended early"
        got.append(ev)
        if len(got) == n:
            break
    return got


async def _rest(events: Any) -> list[tuple[str, dict[str, Any]]]:
    got = []
    async for ev in events:
        if ev is None:
            return got
        got.append(ev)
    raise AssertionError("the stream broke before its end")


async def test_two_workers_serve_sse_grpc_and_ds_and_a_reader_resumes_on_the_other(
        workers: Workers, dlog: DeliveryLog) -> None:
    url = workers.gw.url
    run_id = unique("wk")
    chunks = run_chunks(run_id, "t", [f"d{i}" for i in range(6)])
    w, offsets = await write_run(dlog, run_id, chunks[:5], close=False)
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        async with _sse(url, run_id) as events:
            first = await _take(events, 3)
            served_by = await workers.serving(http)
        assert [c for _, c in first] == chunks[:3]
        # Reconnect until the kernel hands the connection to the other worker (each try is
        # a fresh source port); that one resumes after the last id the reader saw.
        for _ in range(60):
            async with _sse(url, run_id, last_event_id=first[-1][0]) as events:
                head = await _take(events, 1)
                if await workers.serving(http) == served_by:
                    continue
                offsets += await w.append(chunks[5:], origin="journal")
                await w.close("completed")
                rest = head + await _rest(events)
                break
        else:
            pytest.fail("60 reconnects all landed on the same worker")
    assert [o for o, _ in rest] == offsets[3:]
    assert [c for _, c in rest] == chunks[3:]  # exactly once, in order

    # gRPC on the shared port (every worker binds it): the whole run, from its start.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{workers.grpc_port}",
                                         options=[("grpc.enable_http_proxy", 0)]) as ch:
        got = await read_events(pbg.RunsStub(ch).JoinRun(pb.RunJoinRequest(run_id=run_id, from_start=True),
                                                         timeout=30))
    assert got.error is None and got.end == "completed", got
    assert [json.loads(c) for _, c in got.chunks] == chunks

    # /ds appends over fresh connections (either worker) form one stream, in order.
    name = unique("wk")
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        assert (await http.put(f"{url}/ds/{name}", headers={"content-type": "text/plain"})).status_code == 201
    for i in range(12):
        async with httpx.AsyncClient(trust_env=False, timeout=30) as own:
            r = await own.post(f"{url}/ds/{name}", headers={"content-type": "text/plain"}, content=f"{i},".encode())
            assert r.status_code == 204, r.text
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        read = await http.get(f"{url}/ds/{name}", params={"offset": "-1"})
    assert read.content == "".join(f"{i}," for i in range(12)).encode()


async def test_a_sigkilled_worker_is_replaced_and_its_readers_resume(
        workers: Workers, dlog: DeliveryLog) -> None:
    url = workers.gw.url
    run_id = unique("wk")
    chunks = run_chunks(run_id, "t", [f"d{i}" for i in range(6)])
    w, offsets = await write_run(dlog, run_id, chunks[:4], close=False)
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        with pytest.raises(httpx.TransportError):  # the worker's death breaks the stream
            async with _sse(url, run_id) as events:
                first = await _take(events, 2)
                index = await workers.serving(http)
                victim = workers.pids()[index]
                os.kill(victim, signal.SIGKILL)
                await _rest(events)
        # It is started again (a new pid for that index) and serves its metrics port.
        await assert_eventually(lambda: workers.pids().get(index, victim) != victim, timeout=30)

        async def back() -> bool:
            try:
                return (await http.get(f"http://127.0.0.1:{workers.metrics + index}/metrics")).status_code == 200
            except httpx.TransportError:
                return False
        await assert_eventually(back, timeout=60)
    # The reader resumes after the last id it saw, on whichever worker takes it.
    async with _sse(url, run_id, last_event_id=first[-1][0]) as events:
        head = await _take(events, 2)
        offsets += await w.append(chunks[4:], origin="journal")
        await w.close("completed")
        rest = head + await _rest(events)
    assert [c for _, c in first] == chunks[:2]
    assert [o for o, _ in rest] == offsets[2:]
    assert [c for _, c in rest] == chunks[2:]

    # SIGTERM to the supervisor stops every worker, and the supervisor exits 0.
    pids = list(workers.pids().values())
    await workers.gw.stop(timeout=30)
    assert workers.gw.proc is not None and workers.gw.proc.returncode == 0, workers.gw.log_text()[-3000:]

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    await assert_eventually(lambda: all(gone(p) for p in pids), timeout=10)
    assert "Traceback" not in workers.gw.log_text(), workers.gw.log_text()[-3000:]
