"""A full JetStream store over gRPC (the gRPC twin of
tests/gateway/test_storage_full.py): StartRun is refused with UNAVAILABLE +
LOG_STORAGE_FULL at once; an open JoinRun gets a RunEvent.notice naming the cause; once
nats-server stores again the stream goes on and ends with every chunk once."""
from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import grpc
import pytest

from baton.errors import LogStorageFull
from baton.log import DeliveryLog
from baton.v1 import runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
from baton.v1.runs_pb2 import RunRecord
from baton_tools.testing.servers import NatsServer
from tests.conftest import assert_eventually, unique
from tests.grpc.conftest import CHANNEL_OPTIONS, error_info, start_request
from tests.log.conftest import chunk, unique_cfg
from tests.log.test_storage_full import fill, small_nats, tmpfs_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(240)


async def test_full_store_over_grpc(small_nats: NatsServer, tmpfs_dir: pathlib.Path, make_gateway: Any,
                                    cc: Any) -> None:
    cfg = unique_cfg()
    log = await DeliveryLog.connect(small_nats.url, cfg)
    try:
        await log.provision()
        gw = await make_gateway(nats_url=small_nats.url, log_config=cfg, keepalive=0.3, grpc_listen="127.0.0.1:0")
        run_id = unique("disk-run-")
        await cc.create_or_resume_run(RunRecord(run_id=run_id, thread_id=unique("t-")))  # JoinRun needs a record
        w = log.writer(run_id, 1, publish_timeout=0.5)
        await w.fence()
        expected = [chunk(i) for i in range(6)]
        await w.append(expected[:3])
        filler = fill(tmpfs_dir)

        async def not_storing() -> bool:
            try:
                await log.probe_storage("test", timeout=2.0)
            except LogStorageFull:
                return True
            return False

        await assert_eventually(not_storing, timeout=90, interval=0.5)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.state.grpc_port}", options=CHANNEL_OPTIONS) as ch:
            runs = pbg.RunsStub(ch)
            # A new run: refused at once with the cause.
            try:
                async for _ in runs.StartRun(start_request(unique("t-"), unique("r-"))):
                    pass
                raise AssertionError("StartRun was not refused")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
                assert error_info(exc).reason == "LOG_STORAGE_FULL"

            # An open stream: the chunks so far, then a notice (not log data) naming the cause.
            got: list[tuple[str, bytes]] = []
            call = runs.JoinRun(pb.RunJoinRequest(run_id=run_id, from_start=True))
            it = call.__aiter__()
            notice = None
            while notice is None:
                async with asyncio.timeout(30):
                    ev = await it.__anext__()
                got += [(c.offset, c.json) for c in ev.chunks]
                if ev.HasField("notice"):
                    notice = ev.notice
            assert notice.reason == "LOG_STORAGE_FULL" and "storage full" in notice.message

            # Storage back: the same stream goes on and ends with every chunk once.
            filler.unlink()
            small_nats.restart()

            async def stores() -> bool:
                return await gw.state.log_health.problem() is None

            await assert_eventually(stores, timeout=30, interval=0.5)
            await w.append(expected[3:])
            assert await w.close("completed")
            end = None
            while end is None:
                async with asyncio.timeout(30):
                    ev = await it.__anext__()
                got += [(c.offset, c.json) for c in ev.chunks]
                if ev.HasField("end"):
                    end = ev.end.status
            assert end == "completed"
            assert [json.loads(j) for _, j in got] == expected
            call.cancel()
    finally:
        await log.close()
