"""gRPC ``JoinRun`` with ``from_snapshot``: the same stream as the HTTP join from a snapshot
(the snapshot's events, only the last with an offset, then the chunks after it, then the end)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from baton.log import DeliveryLog, LogConfig, latest_snapshot
from baton.v1 import runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
from tests.conftest import unique
from tests.gateway.conftest import write_run
from tests.gateway.test_snapshot_join import turns
from tests.grpc.conftest import read_events

pytestmark = pytest.mark.timeout(120)


async def test_join_from_snapshot_over_grpc(grpc_gateway: Any, runs: pbg.RunsStub, dlog: DeliveryLog,
                                            log_cfg: LogConfig) -> None:
    sdlog = DeliveryLog(dlog.nc, dataclasses.replace(log_cfg, snapshot_chunks=10, snapshot_bytes=1500))
    run_id, thread_id = unique("run"), unique("th")
    chunks = turns(run_id, thread_id, 6)
    w, offsets = await write_run(sdlog, run_id, chunks[:-3], close=False)
    found = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert found is not None
    snap = found[0]
    k = offsets.index(str(snap.offset)) + 1
    rest = await w.append(chunks[-3:])
    await w.close("completed")
    final = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert final is not None
    got = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run_id, from_snapshot=True)))
    assert got.error is None and got.end == "completed"
    events = final[0].events
    assert [o for o, _ in got.chunks] == [""] * (len(events) - 1) + [rest[-1]]
    assert [json.loads(j) for _, j in got.chunks] == list(events)
    assert k < len(offsets)
