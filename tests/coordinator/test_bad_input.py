"""Bad input is refused with INVALID_ARGUMENT naming the field (raw gRPC and the client)."""
from __future__ import annotations

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from baton import errors
from baton.coordinator_client import CoordinatorClient, HostInfo, SandboxInstance
from baton.grpc_errors import from_rpc_error
from baton.v1 import coordinator_pb2 as pb
from baton.v1 import coordinator_pb2_grpc as pb_grpc
from baton.v1.runs_pb2 import RunRecord, RunStatus

BAD_IDS = {"empty": "", "too long": "x" * 257, "long multibyte": "é" * 129, "newline": "a\nb",
           "nul": "a\x00b", "escape": "\x1b[31m", "bidi override": "a\u202eb"}


@pytest.fixture
async def stub(coord) -> pb_grpc.CoordinatorStub:  # type: ignore[no-untyped-def]
    ch = grpc.aio.insecure_channel(coord.address)
    yield pb_grpc.CoordinatorStub(ch)
    await ch.close()


def _cases() -> list[tuple[str, str, object, str]]:
    out = []
    for label, bad in BAD_IDS.items():
        out += [
            (label, "CreateOrResumeRun", pb.CreateOrResumeRunRequest(record=RunRecord(run_id=bad, thread_id="t")), "record.run_id"),
            (label, "CreateOrResumeRun", pb.CreateOrResumeRunRequest(record=RunRecord(run_id="r", thread_id=bad)), "record.thread_id"),
            (label, "GetRun", pb.GetRunRequest(run_id=bad), "run_id"),
            (label, "FindActiveRun", pb.FindActiveRunRequest(thread_id=bad), "thread_id"),
            (label, "ClaimRun", pb.ClaimRunRequest(run_id=bad, session_id=1, host_id="h"), "run_id"),
            (label, "ClaimRun", pb.ClaimRunRequest(run_id="r", session_id=1, host_id=bad), "host_id"),
            (label, "RegisterReader", pb.RegisterReaderRequest(run_id="r", session_id=1, reader_id=bad), "reader_id"),
            (label, "GetSandbox", pb.GetSandboxRequest(sandbox_key=bad), "sandbox_key"),
            (label, "RequestRunCancel", pb.RequestRunCancelRequest(run_id=bad), "run_id"),
        ]
    return out


@pytest.mark.parametrize("label,method,request_,field", _cases(),
                         ids=[f"{c[1]}-{c[3]}-{c[0]}" for c in _cases()])
async def test_bad_ids_are_invalid_argument_naming_the_field(stub, label, method, request_, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await getattr(stub, method)(request_, timeout=5)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    exc = from_rpc_error(ei.value)
    assert isinstance(exc, errors.InvalidArgument) and exc.field == field


async def test_256_byte_id_is_accepted(cc: CoordinatorClient) -> None:
    run_id = "r" * 256
    rec, created = await cc.create_or_resume_run(RunRecord(run_id=run_id, thread_id="é" * 128))
    assert created and (await cc.get_run(run_id)).record.run_id == run_id


async def test_unknown_enum_values_are_refused_and_nothing_is_written(cc: CoordinatorClient, stub) -> None:  # type: ignore[no-untyped-def]
    # Proto3 enums are open: status=99 decodes, and used to be stored.
    rec, _ = await cc.create_or_resume_run(RunRecord(run_id="enum-run", thread_id="enum-th"))
    for call in (lambda: cc.update_run(rec.run_id, RunRecord(status=99), ["status"]),  # type: ignore[arg-type]
                 lambda: cc.create_or_resume_run(RunRecord(run_id="enum-run-2", thread_id="enum-th",
                                                           status=99))):  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidArgument) as ei:
            await call()
        assert ei.value.field == "record.status" and "unknown value 99" in str(ei.value)
    assert (await cc.get_run(rec.run_id)).record.status == rec.status
    with pytest.raises(errors.UnknownRun):
        await cc.get_run("enum-run-2")
    with pytest.raises(grpc.aio.AioRpcError) as e2:
        await stub.PutRunInput(pb.PutRunInputRequest(run_id=rec.run_id, op=99), timeout=5)  # type: ignore[arg-type]
    assert e2.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A known value is written.
    outcome, after = await cc.update_run(rec.run_id, RunRecord(status=RunStatus.RUN_STATUS_INTERRUPTED), ["status"])
    assert after is not None and after.status == RunStatus.RUN_STATUS_INTERRUPTED


async def test_other_bad_fields(cc: CoordinatorClient, stub) -> None:  # type: ignore[no-untyped-def]
    rec, _ = await cc.create_or_resume_run(RunRecord(run_id="bad-fields-run", thread_id="bad-fields-th"))
    cases = [
        (cc.update_run(rec.run_id, RunRecord(), ["no_such_field"]), "update_mask"),
        (cc.update_run(rec.run_id, RunRecord(), ["run_id"]), "update_mask"),
        (cc.update_run(rec.run_id, RunRecord(), []), "update_mask"),
        (cc.claim_run(rec.run_id, 1, "h", purpose="steal"), "purpose"),
        (cc.claim_run(rec.run_id, 0, "h"), "session_id"),
        (cc.open_session(ttl=-1), "ttl_seconds"),
        (cc.list_reclaimable(now=-5, ttl=1), "now"),
        (cc.list_reclaimable(now=0, ttl=float("nan")), "ttl_seconds"),
        (cc.put_sandbox(SandboxInstance(sandbox_key="k", provider="vm")), "sandbox.provider"),
        (cc.register_host(HostInfo(host_id="h", address="a:1")), "host.session_id"),
        (cc.register_host(HostInfo(host_id="", address="a:1", session_id=1)), "host.host_id"),
    ]
    for coro, field in cases:
        with pytest.raises(errors.InvalidArgument) as ei:
            await coro
        assert ei.value.field == field
    # Raw: the status code is INVALID_ARGUMENT.
    with pytest.raises(grpc.aio.AioRpcError) as e2:
        await stub.UpdateRun(pb.UpdateRunRequest(run_id=rec.run_id, update_mask=FieldMask(paths=["bogus"])), timeout=5)
    assert e2.value.code() == grpc.StatusCode.INVALID_ARGUMENT
