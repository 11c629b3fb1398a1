"""Batched presence (``RegisterReaders``, ``UnregisterReaders``) against a real etcd: each
reader is a key of its own under the session's lease, as if registered alone, and the last
one leaving detaches the run (docs/design.md §3.3)."""
from __future__ import annotations

from typing import Any, AsyncIterator

import grpc
import pytest

from baton import errors
from baton.coordinator_client import CoordinatorClient
from baton.runs import MAX_READERS_PER_CALL
from baton.v1 import coordinator_pb2 as pb
from baton.v1 import coordinator_pb2_grpc as pb_grpc
from baton.v1.runs_pb2 import RunRecord
from baton_tools.testing.cluster import InProcessCoordinator
from baton_tools.testing.servers import free_port
from coordinator._keys import prefix_end
from tests.conftest import unique


async def _new(cc: CoordinatorClient) -> RunRecord:
    rec, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-")))
    return rec


async def _reader_keys(coord: InProcessCoordinator, run_id: str) -> dict[str, int]:
    """The run's reader keys in etcd: reader id → the lease it lives under."""
    store = coord.server.store
    prefix = store.keys.readers(run_id)
    kvs, _ = await store.etcd.range(prefix, prefix_end(prefix), timeout=5)
    return {kv.key[len(prefix):].decode(): kv.lease for kv in kvs}


async def _detached(cc: CoordinatorClient, run_id: str) -> bool:
    return (await cc.get_run(run_id)).record.HasField("detached_since")


async def test_each_reader_of_a_batch_is_a_key_under_the_session(coord: InProcessCoordinator,
                                                                  cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    gw = await cc.open_session(5.0, owner="gateway")
    ids = [f"gw/{i:03d}" for i in range(150)]  # three calls: 64, 64, 22
    await cc.register_readers(rec.run_id, gw, ids + ids[:5])
    keys = await _reader_keys(coord, rec.run_id)
    assert len(keys) == 150 and set(keys.values()) == {gw.id}
    await cc.unregister_readers(rec.run_id, ids[:149])
    assert len(await _reader_keys(coord, rec.run_id)) == 1
    assert not await _detached(cc, rec.run_id)  # one reader left
    await cc.unregister_readers(rec.run_id, ids[149:])
    assert await _reader_keys(coord, rec.run_id) == {}
    assert await _detached(cc, rec.run_id)
    await cc.register_readers(rec.run_id, gw, ["back"])  # a reader coming back clears the detach
    assert not await _detached(cc, rec.run_id)


async def test_the_keys_go_with_the_session(coord: InProcessCoordinator, cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    gw = await cc.open_session(5.0, owner="gateway")
    await cc.register_readers(rec.run_id, gw, ["a", "b", "c"])
    await gw.close()
    assert await _reader_keys(coord, rec.run_id) == {}


@pytest.mark.parametrize("ids, field", [
    ([], "reader_ids"),
    ([f"r{i}" for i in range(MAX_READERS_PER_CALL + 1)], "reader_ids"),
    (["fine", "bad\x00id"], "reader_ids[1]"),
    (["fine", "fine", ""], "reader_ids[1]"),
])
async def test_a_bad_batch_is_refused_whole(coord: InProcessCoordinator, cc: CoordinatorClient,
                                            ids: list[str], field: str) -> None:
    rec = await _new(cc)
    gw = await cc.open_session(5.0, owner="gateway")
    for method, req in (("RegisterReaders", pb.RegisterReadersRequest(run_id=rec.run_id, session_id=gw.id,
                                                                      reader_ids=ids)),
                        ("UnregisterReaders", pb.UnregisterReadersRequest(run_id=rec.run_id, reader_ids=ids))):
        with pytest.raises(errors.InvalidArgument) as err:
            await cc._unary(method, req, 5)
        assert err.value.field == field
    assert await _reader_keys(coord, rec.run_id) == {}


async def test_a_repeated_reader_counts_once(coord: InProcessCoordinator, cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    gw = await cc.open_session(5.0, owner="gateway")
    await cc._unary("RegisterReaders", pb.RegisterReadersRequest(
        run_id=rec.run_id, session_id=gw.id, reader_ids=["same"] * (MAX_READERS_PER_CALL + 1)), 5)
    assert list(await _reader_keys(coord, rec.run_id)) == ["same"]


async def test_a_batch_under_a_lost_session_says_so(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    gw = await cc.open_session(5.0, owner="gateway")
    sid = gw.id
    await gw.close()
    with pytest.raises(errors.SessionLost):
        await cc.register_readers(rec.run_id, sid, ["a", "b"])


class _OlderCoordinator(pb_grpc.CoordinatorServicer):
    """A coordinator of a release without the batched calls: they answer UNIMPLEMENTED."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.batched = 0

    async def RegisterReaders(self, request: Any, context: Any) -> Any:
        self.batched += 1  # (an older server has no such method: gRPC answers the same)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    async def UnregisterReaders(self, request: Any, context: Any) -> Any:
        self.batched += 1
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    async def RegisterReader(self, request: pb.RegisterReaderRequest, context: Any) -> pb.RegisterReaderResponse:
        self.calls.append(("register", request.reader_id))
        return pb.RegisterReaderResponse()

    async def UnregisterReader(self, request: pb.UnregisterReaderRequest,
                               context: Any) -> pb.UnregisterReaderResponse:
        self.calls.append(("unregister", request.reader_id))
        return pb.UnregisterReaderResponse()


@pytest.fixture
async def older() -> AsyncIterator[tuple[str, _OlderCoordinator]]:
    servicer, server = _OlderCoordinator(), grpc.aio.server()
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    await server.start()
    try:
        yield address, servicer
    finally:
        await server.stop(None)


async def test_an_older_coordinator_gets_one_call_per_reader(older: tuple[str, _OlderCoordinator],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A rolling upgrade that reaches the gateways first: their readers are still registered.
    For a while the client does not try the batched call again; then it does (the replicas
    may have been upgraded since)."""
    address, servicer = older
    async with CoordinatorClient(address) as client:
        await client.register_readers("run-1", 7, ["a", "b"])
        await client.unregister_readers("run-1", ["a", "b"])
        await client.register_readers("run-1", 7, ["c"])  # remembered: no batched call tried again
        assert sorted(servicer.calls[:2]) == [("register", "a"), ("register", "b")]
        assert sorted(servicer.calls[2:4]) == [("unregister", "a"), ("unregister", "b")]
        assert servicer.calls[4:] == [("register", "c")]
        assert servicer.batched == 1
        monkeypatch.setattr(client, "_unbatched_until", 0.0)  # the while is over
        await client.register_readers("run-1", 7, ["d"])
        assert servicer.batched == 2 and servicer.calls[5:] == [("register", "d")]
