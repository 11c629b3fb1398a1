"""Exactly once across reconnects and a SIGKILL of the driving host, over gRPC: a client
whose stream breaks joins after the last offset it holds and gets exactly the rest; a stream
left open across the kill delivers every chunk once, in order."""
from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import grpc
import httpx

from baton.coordinator_client import CoordinatorClient
from baton.log import LogConfig
from baton.v1 import runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
from baton_tools.testing.cluster import start_host
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import SLOW_TEXT, host_settings
from tests.grpc.conftest import agent, read_events, sse_chunks, start_request


async def test_resume_after_offset_through_a_sigkill_of_the_driving_host(
        coordinator: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path, tmp_path: pathlib.Path,
        grpc_gateway: Any, runs: pbg.RunsStub, http: httpx.AsyncClient) -> None:
    settings = host_settings(log_cfg, replay_dir, tmp_path)
    hosts = [await start_host(coordinator.address, nats.url, log_dir=tmp_path, **settings) for _ in range(2)]
    try:
        thread, run = unique("th"), unique("run")
        req = start_request(thread, run, agent=agent("claude-stream-json/slow.jsonl", speed=1, delay=0.1))
        first = await read_events(runs.StartRun(req), stop_after=4)
        if first.error is not None and first.error.code() == grpc.StatusCode.ABORTED:
            # The start raced the coordinator's failover for the new record (RUN_CLAIM_LOST,
            # the start path's known race, fixed separately): a retry with the same run id
            # joins the run, which is what a client does.
            first = await read_events(runs.StartRun(req), stop_after=4)
        assert first.error is None and len(first.chunks) >= 4
        # A second reader stays connected through the kill.
        steady = asyncio.create_task(read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run, from_start=True))))

        async with CoordinatorClient(coordinator.address) as cc:
            driver = (await cc.get_run(run)).claim.host_id
            victim = next(h for h in hosts if h.host_id == driver)
            await victim.kill()

            async def claim_moved() -> bool:
                view = await cc.get_run(run)
                return view.claim is None or view.claim.host_id != driver
            await assert_eventually(claim_moved, timeout=20)

        rest = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run, after_offset=first.chunks[-1][0])))
        assert rest.error is None and rest.end == "completed"
        whole = first.chunks + rest.chunks
        offsets = [int(o) for o, _ in whole]
        assert offsets == sorted(set(offsets))  # each chunk once, in order
        text = "".join(c["delta"] for c in first.json() + rest.json() if c["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == SLOW_TEXT
        assert (first.json() + rest.json())[-1]["type"] == "RUN_FINISHED"

        async with asyncio.timeout(60):
            kept = await steady
        assert kept.error is None and kept.end == "completed" and kept.chunks == whole
        sse, ended = await sse_chunks(http, grpc_gateway.url, run)
        assert ended and sse == whole
    finally:
        for h in hosts:
            await h.stop()
