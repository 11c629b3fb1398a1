"""The floor of ``bench/coordinator.py``: the least a Python gRPC service on the coordinator's
stack does per claim or update, with none of the coordinator's rules, store or cache in it.

``python -m bench._coord_floor <mode> <etcd host:port>`` serves ``baton.v1.Coordinator``'s
``ClaimRun`` and ``UpdateRun`` on a free loopback port (printed on stdout), with the
coordinator's event loop (uvloop), server options and request-decoding interceptor:

  * ``noop``: answers at once (a fixed response): the gRPC hop alone.
  * ``txn``: sends one etcd write transaction per call (put the run's key if it is absent,
    a value of a record's size) and answers: a gRPC hop in front of one etcd round trip,
    the least a coordinator could do whose cache knows the run.
  * ``read-txn``: reads the run's two keys (record and claim, one read transaction), then
    sends the ``txn`` write: a gRPC hop in front of raw etcd's own read and write, the least
    a coordinator that keeps no state (or a cold cache) could do.
"""
from __future__ import annotations

import sys
from typing import Any

import grpc
from aetcd import rpc

from baton.grpc_decode import DecodeCheck
from baton.v1 import coordinator_pb2 as pb
from baton.v1 import coordinator_pb2_grpc as pb_grpc
from baton.v1.runs_pb2 import RunRecord

_VALUE = RunRecord(run_id="r" * 24, thread_id="t" * 24, sandbox_key="sb-updated", driver_epoch=1,
                   driver_host="bench", started_at=1.0).SerializeToString()


class _Floor(pb_grpc.CoordinatorServicer):
    def __init__(self, mode: str, kv: Any) -> None:
        self.mode, self.kv = mode, kv

    async def _txn(self, run_id: str, op: str) -> None:
        key = f"/bench-floor/{op}/{run_id}".encode()
        if self.mode == "read-txn":
            await self.kv.Txn(rpc.TxnRequest(success=[
                rpc.RequestOp(request_range=rpc.RangeRequest(key=key)),
                rpc.RequestOp(request_range=rpc.RangeRequest(key=key + b"/claim"))]), timeout=5.0)
        await self.kv.Txn(rpc.TxnRequest(
            compare=[rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0)],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=_VALUE))]), timeout=5.0)

    async def ClaimRun(self, request: pb.ClaimRunRequest, context: Any) -> pb.ClaimRunResponse:
        if self.mode != "noop":
            await self._txn(request.run_id, "claim")
        return pb.ClaimRunResponse(epoch=1, record=RunRecord(run_id=request.run_id, driver_epoch=1))

    async def UpdateRun(self, request: pb.UpdateRunRequest, context: Any) -> pb.UpdateRunResponse:
        if self.mode != "noop":
            await self._txn(request.run_id, "update")
        return pb.UpdateRunResponse(outcome=pb.UPDATE_OUTCOME_APPLIED, record=RunRecord(run_id=request.run_id))


async def _serve(mode: str, etcd: str) -> None:
    channel = grpc.aio.insecure_channel(etcd, options=(("grpc.enable_http_proxy", 0),))
    server = grpc.aio.server(options=(("grpc.so_reuseport", 0),), interceptors=[DecodeCheck()])
    pb_grpc.add_CoordinatorServicer_to_server(_Floor(mode, rpc.KVStub(channel)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    import uvloop

    uvloop.run(_serve(sys.argv[1], sys.argv[2]))
