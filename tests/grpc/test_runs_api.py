"""``baton.v1.Runs`` against a real gateway, coordinator, NATS and sandbox host: every RPC,
and every bad input answered with its status and ``ErrorInfo`` reason (the HTTP reasons)."""
from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from baton.v1 import runs_pb2, runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
from tests.conftest import unique
from tests.gateway.conftest import run_chunks, write_run
from tests.grpc.conftest import (CHANNEL_OPTIONS, agent, error_info, read_events, sse_chunks,
                                 start_request)


async def test_start_streams_the_run_to_its_end_with_the_sse_bytes(host: Any, grpc_gateway: Any,
                                                                    runs: pbg.RunsStub,
                                                                    http: httpx.AsyncClient) -> None:
    thread, run = unique("th"), unique("run")
    call = runs.StartRun(start_request(thread, run))
    got = await read_events(call)
    assert got.error is None and got.end == "completed"
    assert dict(await call.initial_metadata())["x-run-id"] == run
    types = [c["type"] for c in got.json()]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    text = "".join(c["delta"] for c in got.json() if c["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "hello from the replay"
    offsets = [int(o) for o, _ in got.chunks]
    assert offsets == sorted(set(offsets))
    # Every client sees the same bytes: the SSE join of the same run.
    sse, ended = await sse_chunks(http, grpc_gateway.url, run)
    assert ended and sse == got.chunks

    # A retry with the same run id joins the run and starts nothing.
    again = await read_events(runs.StartRun(start_request(thread, run)))
    assert again.chunks == got.chunks and again.end == "completed"
    listed = await runs.ListRuns(pb.RunListRequest(thread_id=thread))
    assert [r.run_id for r in listed.runs] == [run]

    # JoinRun after an offset: exactly the rest; only_new on a closed log: just the end.
    mid = got.chunks[2][0]
    rest = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run, after_offset=mid)))
    assert rest.chunks == got.chunks[3:] and rest.end == "completed"
    new = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run, only_new=True)))
    assert new.chunks == [] and new.end == "completed"

    info = await runs.GetRun(pb.RunGetRequest(run_id=run))
    assert (info.run_id, info.thread_id, info.status, info.agent) == (
        run, thread, runs_pb2.RUN_STATUS_COMPLETED, "replay")
    assert info.HasField("started_at") and info.HasField("finished_at")

    tr = await runs.GetTranscript(pb.TranscriptRequest(thread_id=thread))
    msgs = json.loads(tr.messages_json)
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    assert msgs[-1]["content"] == "hello from the replay" and tr.revision > 0
    http_tr = (await http.get(f"{grpc_gateway.url}/api/threads/{thread}/messages")).json()
    assert http_tr["messages"] == msgs
    assert (tr.next_page_token, tr.total_messages, tr.first_index) == ("", 2, 0)
    # Paged, newest first: one message, then the older one by its token; HTTP the same.
    newest = await runs.GetTranscript(pb.TranscriptRequest(thread_id=thread, page_size=1))
    assert json.loads(newest.messages_json) == msgs[1:] and newest.next_page_token and newest.first_index == 1
    older = await runs.GetTranscript(pb.TranscriptRequest(thread_id=thread, page_size=1,
                                                          page_token=newest.next_page_token))
    assert json.loads(older.messages_json) == msgs[:1] and older.next_page_token == "" and older.first_index == 0
    http_page = (await http.get(f"{grpc_gateway.url}/api/threads/{thread}/messages", params={"limit": 1})).json()
    assert http_page["messages"] == msgs[1:] and http_page["nextCursor"] == newest.next_page_token
    assert (http_page["total"], http_page["firstIndex"]) == (2, 1)

    active = await runs.FindActiveRun(pb.ActiveRunRequest(thread_id=thread))
    assert active.run_id == ""


async def test_cancel_with_wait_and_find_active(host: Any, grpc_gateway: Any, runs: pbg.RunsStub) -> None:
    thread, run = unique("th"), unique("run")
    call = runs.StartRun(start_request(thread, run, agent=agent("claude-stream-json/slow.jsonl", speed=1,
                                                                 delay=0.2)))
    first = await read_events(call, stop_after=2)
    assert len(first.chunks) == 2
    assert (await runs.FindActiveRun(pb.ActiveRunRequest(thread_id=thread))).run_id == run

    out = await runs.CancelRun(pb.RunCancelRequest(thread_id=thread, wait=True, timeout_seconds=60))
    assert out.run_id == run and out.cancel_requested
    assert out.run.status == runs_pb2.RUN_STATUS_ABORTED and out.run.cancel_requested
    assert json.loads(out.confirmation_json) is not None

    rest = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run, after_offset=first.chunks[-1][0])))
    assert rest.end == "aborted"
    assert rest.json()[-1]["type"] in ("RUN_ERROR", "RUN_FINISHED")
    assert (await runs.FindActiveRun(pb.ActiveRunRequest(thread_id=thread))).run_id == ""
    # Cancelling a finished run: accepted, nothing changes.
    again = await runs.CancelRun(pb.RunCancelRequest(run_id=run))
    assert again.cancel_requested and again.run_known and not again.HasField("run")


async def test_list_runs_pages_and_list_agents(host: Any, grpc_gateway: Any, runs: pbg.RunsStub) -> None:
    thread = unique("th")
    ids = []
    for i in range(3):
        run = unique(f"run{i}")
        ids.append(run)
        got = await read_events(runs.StartRun(start_request(thread, run)))
        assert got.end == "completed"
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await runs.ListRuns(pb.RunListRequest(thread_id=thread, page_size=2, page_token=token))
        seen += [r.run_id for r in page.runs]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == ids and pages == 2

    agents = await runs.ListAgents(pb.AgentListRequest())
    assert agents.default_kind == "replay"
    journals = {a.journal for a in agents.agents if a.kind == "replay"}
    assert "claude-stream-json/hello.jsonl" in journals
    assert {a.kind for a in agents.agents} >= {"replay", "claude-code", "codex"}


async def _fails(call: Any, code: grpc.StatusCode, reason: str) -> dict[str, str]:
    try:
        result = call
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
        else:
            await result
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == code, (exc.code(), exc.details())
        info = error_info(exc)
        assert (info.reason, info.domain) == (reason, "baton.dev")
        return dict(info.metadata)
    raise AssertionError(f"expected {code.name} {reason}")


async def test_bad_input_each_with_its_status_and_reason(host: Any, grpc_gateway: Any, runs: pbg.RunsStub) -> None:
    IA, NF = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    thread = unique("th")
    # Missing and oversize ids.
    await _fails(runs.StartRun(start_request(thread, "")), IA, "DURABLE_RUN_ID_REQUIRED")
    meta = await _fails(runs.StartRun(start_request("", unique("run"))), IA, "INVALID_ARGUMENT")
    assert meta["field"] == "threadId"
    meta = await _fails(runs.StartRun(start_request(thread, "r" * 1000)), IA, "INVALID_ARGUMENT")
    assert meta["field"] == "X-Run-Id" or meta["field"] == "runId"
    await _fails(runs.JoinRun(pb.RunJoinRequest(run_id="", from_start=True)), IA, "INVALID_ARGUMENT")
    # No position (or a false one): as HTTP without an offset, the caller is told what to send.
    for no_position in (pb.RunJoinRequest(run_id=unique("run")), pb.RunJoinRequest(run_id=unique("run"), from_start=False),
                        pb.RunJoinRequest(run_id=unique("run"), only_new=False)):
        meta = await _fails(runs.JoinRun(no_position), IA, "INVALID_ARGUMENT")
        assert meta["field"] == "position"
    await _fails(runs.GetRun(pb.RunGetRequest(run_id="x" * 1000)), IA, "INVALID_ARGUMENT")
    await _fails(runs.StartRun(start_request(thread, unique("run"), agent=runs_pb2.AgentSpec(kind="nope"))),
                 IA, "INVALID_ARGUMENT")
    await _fails(runs.StartRun(start_request(thread, unique("run"), agent=agent("../../etc/passwd"))),
                 IA, "INVALID_ARGUMENT")
    bad_msgs = pb.RunStartRequest(thread_id=thread, run_id=unique("run"), messages_json="{not json")
    await _fails(runs.StartRun(bad_msgs), IA, "INVALID_ARGUMENT")
    big = pb.RunStartRequest(thread_id=thread, run_id=unique("run"),
                             messages_json=json.dumps([{"role": "user", "content": "x" * (1 << 20)}]))
    await _fails(runs.StartRun(big), IA, "BODY_TOO_LARGE")
    # Unknown run: NOT_FOUND at once, on every RPC that names one.
    missing = unique("missing")
    assert (await _fails(runs.JoinRun(pb.RunJoinRequest(run_id=missing, from_start=True)), NF,
                         "UNKNOWN_RUN"))["run_id"] == missing
    await _fails(runs.GetRun(pb.RunGetRequest(run_id=missing)), NF, "UNKNOWN_RUN")
    # A cancel of a run id with no run yet is kept for its start, not refused.
    for wait in (False, True):  # said to be unknown, at once: a wait does not wait for it
        out = await runs.CancelRun(pb.RunCancelRequest(run_id=missing, wait=wait, timeout_seconds=60), timeout=10)
        assert (out.run_id, out.cancel_requested, out.run_known, out.HasField("run")) == (missing, True, False, False)
    await _fails(runs.CancelRun(pb.RunCancelRequest(thread_id=unique("th"))), NF, "UNKNOWN_THREAD")
    await _fails(runs.CancelRun(pb.RunCancelRequest()), IA, "INVALID_ARGUMENT")
    await _fails(runs.CancelRun(pb.RunCancelRequest(run_id=missing, wait=True, timeout_seconds=1e9)),
                 IA, "INVALID_ARGUMENT")
    await _fails(runs.GetTranscript(pb.TranscriptRequest(thread_id="")), IA, "INVALID_ARGUMENT")
    for bad in (pb.TranscriptRequest(thread_id="t-x", page_size=-1), pb.TranscriptRequest(thread_id="t-x", page_size=1001),
                pb.TranscriptRequest(thread_id="t-x", page_token="garbage!")):
        await _fails(runs.GetTranscript(bad), IA, "INVALID_ARGUMENT")
    await _fails(runs.ListRuns(pb.RunListRequest(page_token="garbage!")), IA, "INVALID_ARGUMENT")
    await _fails(runs.ListRuns(pb.RunListRequest(page_size=-1)), IA, "INVALID_ARGUMENT")

    # Bad offset on a run that exists; a busy thread.
    run = unique("run")
    call = runs.StartRun(start_request(thread, run, agent=agent("claude-stream-json/slow.jsonl", speed=1,
                                                                 delay=0.2)))
    assert len((await read_events(call, stop_after=1)).chunks) >= 1
    assert (await _fails(runs.JoinRun(pb.RunJoinRequest(run_id=run, after_offset="abc")), IA,
                         "INVALID_OFFSET"))["offset"] == "abc"
    meta = await _fails(runs.StartRun(start_request(thread, unique("run"))), grpc.StatusCode.ALREADY_EXISTS,
                        "THREAD_BUSY")
    assert meta == {"thread_id": thread, "active_run_id": run}
    # The same run id on another thread.
    await _fails(runs.StartRun(start_request(unique("th"), run)), IA, "INVALID_ARGUMENT")
    await runs.CancelRun(pb.RunCancelRequest(run_id=run, wait=True, timeout_seconds=60))

    # The server is unharmed.
    assert (await runs.GetRun(pb.RunGetRequest(run_id=run))).status == runs_pb2.RUN_STATUS_ABORTED
    ok = await read_events(runs.StartRun(start_request(thread, unique("run"))))
    assert ok.end == "completed"


async def test_json_nested_past_the_parser_is_invalid_argument(grpc_gateway: Any, runs: pbg.RunsStub) -> None:
    # AnswerApproval parsed updated_input_json itself and caught ValueError only: a value
    # nested past the parser's stack raised RecursionError, answered INTERNAL (found by the
    # fuzz suite, tests/fuzz). Every JSON field of a request is refused the same way.
    IA = grpc.StatusCode.INVALID_ARGUMENT
    for deep in ("[" * 5000 + "]" * 5000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        meta = await _fails(runs.AnswerApproval(pb.ApprovalAnswerRequest(
            run_id=unique("run"), approval_id="req-1", approved=True, updated_input_json=deep)), IA, "INVALID_ARGUMENT")
        assert meta["field"] == "updated_input_json"
        meta = await _fails(runs.StartRun(pb.RunStartRequest(
            thread_id=unique("th"), run_id=unique("run"), messages_json=deep)), IA, "INVALID_ARGUMENT")
        assert meta["field"] == "messages_json"
        await _fails(runs.StartRun(start_request(unique("th"), unique("run"), agent=runs_pb2.AgentSpec(
            kind="replay", options_json=deep))), IA, "INVALID_ARGUMENT")


async def test_tenancy_and_credentials(host: Any, make_gateway: Any, http: httpx.AsyncClient) -> None:
    gw = await make_gateway(keepalive=0.5, grpc_listen="127.0.0.1:0", api_keys={"ka": "alpha", "kb": "beta"})
    target = f"127.0.0.1:{gw.state.grpc_port}"
    a = [("authorization", "Bearer ka")]
    b = [("authorization", "Bearer kb")]
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as ch:
        runs = pbg.RunsStub(ch)
        thread, run = unique("th"), unique("run")
        got = await read_events(runs.StartRun(start_request(thread, run), metadata=a))
        assert got.end == "completed"

        # No or a wrong key: UNAUTHENTICATED on every RPC.
        UA = grpc.StatusCode.UNAUTHENTICATED
        for call in (runs.GetRun(pb.RunGetRequest(run_id=run)),
                     runs.JoinRun(pb.RunJoinRequest(run_id=run)),
                     runs.StartRun(start_request(thread, unique("run"))),
                     runs.ListRuns(pb.RunListRequest()),
                     runs.ListAgents(pb.AgentListRequest()),
                     runs.GetRun(pb.RunGetRequest(run_id=run), metadata=[("authorization", "Bearer nope")]),
                     runs.GetRun(pb.RunGetRequest(run_id=run), metadata=[("authorization", "ka")])):
            await _fails(call, UA, "UNAUTHENTICATED")

        # Another tenant's run and thread do not exist for beta.
        NF = grpc.StatusCode.NOT_FOUND
        await _fails(runs.GetRun(pb.RunGetRequest(run_id=run), metadata=b), NF, "UNKNOWN_RUN")
        await _fails(runs.JoinRun(pb.RunJoinRequest(run_id=run, from_start=True), metadata=b), NF, "UNKNOWN_RUN")
        await _fails(runs.StartRun(start_request(thread, run), metadata=b), NF, "UNKNOWN_RUN")
        await _fails(runs.CancelRun(pb.RunCancelRequest(run_id=run), metadata=b), NF, "UNKNOWN_RUN")
        await _fails(runs.GetTranscript(pb.TranscriptRequest(thread_id=thread), metadata=b), NF, "UNKNOWN_THREAD")
        await _fails(runs.StartRun(start_request(thread, unique("run")), metadata=b), NF, "UNKNOWN_THREAD")
        await _fails(runs.ListRuns(pb.RunListRequest(thread_id=thread), metadata=b), NF, "UNKNOWN_THREAD")
        assert run not in [r.run_id for r in (await runs.ListRuns(pb.RunListRequest(page_size=1000),
                                                                   metadata=b)).runs]
        assert (await runs.FindActiveRun(pb.ActiveRunRequest(thread_id=thread), metadata=b)).run_id == ""
        # Alpha sees its own.
        assert (await runs.GetRun(pb.RunGetRequest(run_id=run), metadata=a)).run_id == run
        listed = await runs.ListRuns(pb.RunListRequest(page_size=1000), metadata=a)
        assert run in [r.run_id for r in listed.runs]

        # Health and reflection need no credentials (probes).
        hc = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="baton.v1.Runs"))
        assert hc.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name async for r in refl for s in r.list_services_response.service]
        assert "baton.v1.Runs" in names


async def test_credentials_come_before_decoding_and_are_sent_once(make_gateway: Any) -> None:
    gw = await make_gateway(keepalive=0.5, grpc_listen="127.0.0.1:0", api_keys={"ka": "alpha", "kb": "beta"})
    a = [("authorization", "Bearer ka")]
    corrupt = b"\x0a\x05ab"  # field 1, 5 bytes long, 2 sent: protobuf cannot decode it
    UA, IA = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.state.grpc_port}", options=CHANNEL_OPTIONS) as ch:
        get_run = ch.unary_unary("/baton.v1.Runs/GetRun")
        join_run = ch.unary_stream("/baton.v1.Runs/JoinRun")
        # No credentials: UNAUTHENTICATED, whatever the bytes.
        await _fails(get_run(corrupt), UA, "UNAUTHENTICATED")
        await _fails(join_run(corrupt), UA, "UNAUTHENTICATED")
        # With them: the request is INVALID_ARGUMENT (not UNKNOWN "Unexpected DecodeError").
        meta = await _fails(get_run(corrupt, metadata=a), IA, "INVALID_ARGUMENT")
        assert meta["field"] == "request"
        await _fails(join_run(corrupt, metadata=a), IA, "INVALID_ARGUMENT")
        # grpcio's health and reflection servicers too (they answered UNKNOWN).
        for call in (ch.unary_unary("/grpc.health.v1.Health/Check")(corrupt),
                     ch.unary_stream("/grpc.health.v1.Health/Watch")(corrupt),
                     ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")(iter([corrupt]))):
            try:
                if isinstance(call, grpc.aio.UnaryUnaryCall):
                    await call
                else:
                    async for _ in call:
                        pass
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == IA and "is not a valid" in (exc.details() or ""), exc
            else:
                raise AssertionError("corrupt bytes were answered")

        # Two authorization entries: refused, whichever key each holds.
        runs = pbg.RunsStub(ch)
        for twice in ([("authorization", "Bearer ka"), ("authorization", "Bearer kb")],
                      [("authorization", "Bearer nope"), ("authorization", "Bearer ka")],
                      [("authorization", "Bearer ka"), ("authorization", "Bearer ka")]):
            try:
                await runs.ListAgents(pb.AgentListRequest(), metadata=twice)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == UA and "one Authorization header" in (exc.details() or ""), exc
            else:
                raise AssertionError(f"{twice} was accepted")
        assert (await runs.ListAgents(pb.AgentListRequest(), metadata=a)).default_kind == "replay"


async def test_unknown_run_and_offsets_before_a_new_run_as_over_http(grpc_gateway: Any, runs: pbg.RunsStub,
                                                                      dlog: Any) -> None:
    """Over gRPC: an unknown run is NOT_FOUND after the bounded wait; an offset before
    a new run's first chunk reads it from the start (a gap means this run's chunks are gone)."""
    from tests.gateway.conftest import run_chunks, write_run

    got = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id="no-such", after_offset="-1")))
    assert got.error is not None and got.error.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(got.error).reason == "UNKNOWN_RUN"
    run = unique("run")
    chunks = run_chunks(run, "t", ["a", "b"])
    _, offsets = await write_run(dlog, run, chunks)
    from_one = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run, after_offset="1")))
    assert [o for o, _ in from_one.chunks] == offsets and from_one.end == "completed" and from_one.gap is None


@pytest.mark.parametrize("surface", ["http", "grpc"])
async def test_a_run_whose_log_closed_reads_as_ended_before_its_record_does(
        grpc_gateway: Any, runs: pbg.RunsStub, http: httpx.AsyncClient, cc: Any, dlog: Any, surface: str) -> None:
    """A host closes the log before it writes the final status (docs/design.md §5.5); a client
    that saw the stream end and reads the run meanwhile gets the close record's end, not ``running``."""
    run_id, thread_id = unique("run"), unique("th")

    async def view() -> tuple[str, str | None, float | None]:
        if surface == "http":
            got = (await http.get(f"{grpc_gateway.url}/api/runs/{run_id}")).json()
            return got["status"], (got["error"] or {}).get("code"), got["finishedAt"]
        info = await runs.GetRun(pb.RunGetRequest(run_id=run_id))
        return (runs_pb2.RunStatus.Name(info.status), info.error.code or None,
                info.finished_at if info.HasField("finished_at") else None)

    async def active() -> str | None:
        if surface == "http":
            return (await http.get(f"{grpc_gateway.url}/api/chat/active", params={"threadId": thread_id})).json()["runId"]
        return (await runs.FindActiveRun(pb.ActiveRunRequest(thread_id=thread_id))).run_id or None

    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run_id, thread_id=thread_id,
                                                     agent=runs_pb2.AgentSpec(kind="replay")))
    session = await cc.open_session(10.0, owner="a-host")  # claimed: nobody else finalizes it meanwhile
    try:
        epoch, _ = await cc.claim_run(run_id, session, "a-host")
        await cc.update_run(run_id, runs_pb2.RunRecord(status=runs_pb2.RUN_STATUS_RUNNING), ["status"],
                            epoch=epoch, session_id=session)
        w, _ = await write_run(dlog, run_id, run_chunks(run_id, thread_id, ["a"])[:2], close=False, epoch=epoch)
        assert (await view())[0] in ("running", "RUN_STATUS_RUNNING")
        assert await active() == run_id
        assert await w.close("failed", "the agent exited with 3", error_code="AGENT_FAILED", finished_at=1234.5)
        status, code, finished_at = await view()
        assert status in ("failed", "RUN_STATUS_FAILED") and code == "AGENT_FAILED"
        assert finished_at == 1234.5  # the time the host gives its record too
        assert (await cc.get_run(run_id)).record.status == runs_pb2.RUN_STATUS_RUNNING  # the record itself lags
        assert await active() is None  # and the thread's active run says the same
    finally:
        await session.close()
