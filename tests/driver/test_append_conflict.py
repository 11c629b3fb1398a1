"""A compare conflict on append (the head moved, not to a higher epoch) re-aligns and never
duplicates: the driver keeps what landed, adopts the head and appends only the rest."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from baton.log import DeliveryLog, LogConfig
from baton_tools.testing.servers import NatsServer
from baton.v1 import runs_pb2
from sandbox_host.driver import RunDriver
from sandbox_host.deps import HostSettings
from tests.conftest import unique


async def test_conflict_mid_run_appends_each_chunk_once(nats: NatsServer) -> None:
    tag = unique("ac")
    cfg = LogConfig.from_env({"BATON_RUNS_STREAM": f"S_{tag}", "BATON_SUBJECT_PREFIX": f"baton.{tag}",
                              "BATON_THREADS_BUCKET": f"t-{tag}"})
    log = await DeliveryLog.connect(nats.url, cfg)
    try:
        await log.provision()
        run_id = unique("run-")
        w = log.writer(run_id, 1)
        seq = await w.fence()
        deps: Any = SimpleNamespace(settings=HostSettings(), session=None)
        driver = RunDriver(deps, runs_pb2.RunRecord(run_id=run_id, thread_id="t"), 1, "fresh", w, fence_seq=seq)
        chunks = [{"type": "CUSTOM", "name": "n", "value": i} for i in range(4)]
        await driver.claim_log.append_now(chunks[:2], "journal")
        # Another writer (not a successor: no higher epoch) moves the head.
        await log.js.publish(cfg.subject(run_id), b"", headers={
            "Baton-Kind": "fence", "Baton-Epoch": "1", "Nats-Msg-Id": f"{run_id}/intruder"})
        await driver.claim_log.append_now(chunks[2:], "journal")
        got = []
        async with log.read(run_id, after="-1", stop_at_close=False) as r:
            async for _, c in r:
                got.append(c)
                if len(got) == 4:
                    break
        assert got == chunks
        heads = await log.stored_headers(run_id)
        assert [h.kind for h in heads] == ["fence", "chunk", "chunk", "fence", "chunk", "chunk"]
        assert driver.stats.appended == 4
    finally:
        await log.close()
