"""``baton.v1.Runs``: the public run API over gRPC, the twin of the HTTP routes (docs/design.md §6).

Served from the gateway process on its own port: the gRPC edge of the run service
(:class:`gateway._service.RunService`), as the HTTP routes are its HTTP edge. Request
messages become the service's requests in :mod:`gateway._grpc_input`; streams are the
service's reads (shared tail, presence, takeover trigger) framed by
:func:`gateway._reader.stream_log` in the ``grpc`` framing, whose frames are ``RunEvent``
wire bytes (:mod:`gateway._grpc_wire`) sent without re-encoding.

Auth: ``authorization: Bearer <key>`` metadata maps to a tenant exactly as the HTTP header
does (``BATON_API_KEYS``); health and reflection on this port need no credentials.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from baton import errors as e, strict_json
from baton.grpc_decode import DecodeCheck
from baton.ids import validate_id
from baton.tls import PLAINTEXT, GrpcTls, add_port
from baton.v1 import runs_pb2, runs_service_pb2 as pb
from gateway import _grpc_wire
from gateway._auth import one_authorization, tenant_of_header
from gateway._errors import StartFailed, grpc_status, mapping_for
from gateway._paging import check_cursor, check_limit, window
from gateway._grpc_input import (cancel_request_of, join_request_of, keep_request_of, list_runs_request_of,
                                 start_request_of)
from gateway._reader import RunRead, stream_log
from gateway._service import (MAX_JSON_DEPTH, JoinRequest, RunService, approval_answer, awaiting_approval, fork_request,
                             steer_request)
from gateway._service._queue import Queued, Steered, wait_started

log = logging.getLogger("gateway.grpc")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Runs"].full_name
# Off by default: a second gateway started on the same port by mistake fails to bind
# instead of silently sharing it. On for the workers of one gateway (gateway/_workers.py).
_OPTIONS = [("grpc.so_reuseport", 0)]
_SHARED_PORT = [("grpc.so_reuseport", 1)]


def run_info(record: runs_pb2.RunRecord, claim: Any | None = None, reap_at: float | None = None) -> pb.RunInfo:
    """The public view of a run (the fields of ``GET /api/runs/{runId}``)."""
    info = pb.RunInfo(
        run_id=record.run_id, thread_id=record.thread_id, status=record.status,
        epoch=int(claim.epoch) if claim is not None else int(record.driver_epoch),
        driver_host=(claim.host_id if claim is not None and claim.host_id else record.driver_host),
        claimed=claim is not None, cancel_requested=record.cancel_requested, agent=record.agent.kind,
        awaiting_approval=awaiting_approval(record), inputs=record.inputs,
    )
    for name in ("started_at", "finished_at", "detached_since"):
        if record.HasField(name):
            setattr(info, name, getattr(record, name))
    if reap_at is not None:
        info.reap_at = reap_at
    if record.HasField("kept_until"):
        info.kept_until = record.kept_until
    if record.HasField("error") and (record.error.message or record.error.code):
        info.error.CopyFrom(record.error)
    return info


Handler = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


class RunsService:
    """The ``baton.v1.Runs`` methods over the gateway's run service.

    Every method maps domain errors to their status with ``ErrorInfo`` (:func:`grpc_status`)
    and a bug to ``INTERNAL`` (logged; the server goes on).
    """

    def __init__(self, service: RunService) -> None:
        self._svc = service
        self._settings = service.state.settings

    def _tenant(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The caller's tenant (``""`` without auth).

        Raises:
            Unauthorized: no or an unknown key; SeveralCredentials: more than one
                ``authorization`` entry.
        """
        if not self._settings.api_keys:
            return ""
        sent = [value if isinstance(value, str) else value.decode("latin-1")
                for key, value in context.invocation_metadata() or () if key == "authorization"]
        return tenant_of_header(one_authorization(sent), self._settings.api_keys)

    async def _stream(self, context: grpc.aio.ServicerContext[Any, Any], read: RunRead) -> None:
        """Write the log's frames; a stream that ends without end/gap fails UNAVAILABLE."""
        body = stream_log(read, "grpc")
        finished = False
        try:
            async for frame in body:
                await context.write(frame)
                if frame and frame[0] in (_grpc_wire.END_TAG, _grpc_wire.GAP_TAG):
                    finished = True
        finally:
            await body.aclose()
            await read.aclose()  # a stream cancelled before its first frame never ran the body
        if not finished:
            # The log read failed (NATS away): the client joins again after its last offset.
            raise e.LogUnavailable(read.run_id, "the log read ended early; join again after the last offset")

    # --- streams ------------------------------------------------------------------------

    async def StartRun(self, request: pb.RunStartRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        t = self._tenant(context)
        req = start_request_of(request, self._svc.limits, self._settings.max_body_bytes)
        placed = await self._svc.start_or_queue(t, req)
        if isinstance(placed, Queued):
            # A busy thread (multitask enqueue/interrupt): say so, then stream the run once it
            # started (the stream stays open while it waits).
            await context.send_initial_metadata((("x-run-id", req.run_id),))
            await context.write(_grpc_wire.notice_frame("RUN_QUEUED", f"position {placed.position}"))
            while not await wait_started(self._svc.state, req.run_id):
                await context.write(_grpc_wire.notice_frame("RUN_QUEUED", "still waiting"))
            await self._stream(context, await self._svc.join(t, JoinRequest(req.run_id, "-1")))
            return
        if isinstance(placed, Steered):
            await context.send_initial_metadata((("x-run-id", placed.run_id),))
            await context.write(_grpc_wire.notice_frame("RUN_STEERED", f"{placed.run_id} {placed.input_id}"))
            await self._stream(context, await self._svc.join(t, JoinRequest(placed.run_id, "now")))
            return
        await context.send_initial_metadata((("x-run-id", req.run_id),))
        await self._stream(context, placed)

    async def JoinRun(self, request: pb.RunJoinRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        t = self._tenant(context)
        req = join_request_of(request)
        await self._stream(context, await self._svc.join(t, req))

    # --- unary --------------------------------------------------------------------------

    async def CancelRun(self, request: pb.RunCancelRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RunCancelResponse:
        t = self._tenant(context)
        out = await self._svc.cancel(t, cancel_request_of(request, self._settings.cancel_wait))
        resp = pb.RunCancelResponse(run_id=out.run_id, cancel_requested=True, run_known=out.run_known)
        if out.view is not None:
            resp.run.CopyFrom(run_info(out.view.record, out.view.claim, out.view.reap_at))
            resp.confirmation_json = (json.dumps(out.confirmation, separators=(",", ":"))
                                      if out.confirmation is not None else "")
        return resp

    async def GetRun(self, request: pb.RunGetRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RunInfo:
        t = self._tenant(context)
        view = await self._svc.run_view(t, validate_id(request.run_id, "runId"))
        return run_info(view.record, view.claim, view.reap_at)

    async def KeepRun(self, request: pb.RunKeepRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RunKeepResponse:
        t = self._tenant(context)
        kept = await self._svc.keep(t, keep_request_of(request))
        return pb.RunKeepResponse(run_id=kept.run_id, requested_seconds=kept.requested, granted_seconds=kept.granted,
                                  kept_until=kept.kept_until,
                                  run=run_info(kept.view.record, kept.view.claim, kept.view.reap_at))

    async def GetMessages(self, request: pb.RunMessagesRequest, context: grpc.aio.ServicerContext[Any, Any]
                          ) -> pb.RunMessagesPage:
        t = self._tenant(context)
        run_id = validate_id(request.run_id, "runId")
        limit = check_limit(request.limit, "limit")
        page = await self._svc.run_messages(t, run_id, limit, request.before or None)
        offset = page["snapshot_offset"]
        return pb.RunMessagesPage(run_id=run_id, messages_json=(b"[" + b",".join(page["messages"]) + b"]").decode(),
                                  total=page["total"], first_index=page["first_index"], next_cursor=page["cursor"],
                                  snapshot_offset="" if offset is None else str(offset))

    async def FindActiveRun(self, request: pb.ActiveRunRequest, context: grpc.aio.ServicerContext[Any, Any]
                            ) -> pb.ActiveRunResponse:
        t = self._tenant(context)
        rec = await self._svc.find_active_run(t, validate_id(request.thread_id, "threadId"))
        return pb.ActiveRunResponse(run_id=rec.run_id if rec is not None else "")

    async def GetTranscript(self, request: pb.TranscriptRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.Transcript:
        t = self._tenant(context)
        thread_id = validate_id(request.thread_id, "threadId")
        limit = check_limit(request.page_size, "page_size")
        check_cursor(request.page_token, "page_token")
        msgs, revision = await self._svc.transcript(t, thread_id)
        page = window(msgs, limit, request.page_token, "page_token")
        return pb.Transcript(thread_id=thread_id, messages_json=json.dumps(page.messages, separators=(",", ":")),
                             revision=revision or 0, next_page_token=page.cursor, total_messages=len(msgs),
                             first_index=page.start)

    async def ListRuns(self, request: pb.RunListRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RunListResponse:
        t = self._tenant(context)
        recs, token = await self._svc.list_runs(t, list_runs_request_of(request))
        return pb.RunListResponse(runs=[run_info(r) for r in recs], next_page_token=token)

    async def ForkThread(self, request: pb.ThreadForkRequest, context: grpc.aio.ServicerContext[Any, Any]
                         ) -> pb.ThreadForkResponse:
        t = self._tenant(context)
        forked = await self._svc.fork_thread(t, fork_request(request.thread_id, request.run_id, request.new_thread_id))
        return pb.ThreadForkResponse(thread_id=forked.thread_id, source_thread_id=forked.source_thread_id,
                                     source_run_id=forked.source_run_id, messages=forked.messages)

    async def DeleteThread(self, request: pb.ThreadDeleteRequest, context: grpc.aio.ServicerContext[Any, Any]
                           ) -> pb.ThreadDeleteResponse:
        t = self._tenant(context)
        await self._svc.delete_thread(t, validate_id(request.thread_id, "threadId"))
        return pb.ThreadDeleteResponse()

    async def AnswerApproval(self, request: pb.ApprovalAnswerRequest, context: grpc.aio.ServicerContext[Any, Any]
                             ) -> pb.ApprovalAnswerResponse:
        t = self._tenant(context)
        updated: Any = None
        if request.updated_input_json:
            try:
                updated = strict_json.loads(request.updated_input_json)
            except ValueError:
                raise e.InvalidArgument("updated_input_json", "must be a JSON object") from None
            except RecursionError:  # nested past the parser's stack (the service checks the rest)
                raise e.InvalidArgument("updated_input_json", f"must not nest deeper than {MAX_JSON_DEPTH} levels") from None
        req = approval_answer(request.run_id, request.approval_id, request.approved, request.message, updated)
        return pb.ApprovalAnswerResponse(approval=await self._svc.answer_approval(t, req))

    async def SteerRun(self, request: pb.RunSteerRequest, context: grpc.aio.ServicerContext[Any, Any]
                       ) -> pb.RunSteerResponse:
        t = self._tenant(context)
        req = steer_request(request.run_id, request.text, request.input_id or None)
        stored = await self._svc.steer(t, req)
        return pb.RunSteerResponse(run_id=req.run_id, input_id=stored.id)

    async def ListQueuedRuns(self, request: pb.QueueListRequest, context: grpc.aio.ServicerContext[Any, Any]
                             ) -> pb.QueueListResponse:
        t = self._tenant(context)
        queued = await self._svc.list_queue(t, validate_id(request.thread_id, "thread_id"))
        return pb.QueueListResponse(runs=[pb.QueuedRunInfo(
            run_id=q.run_id, thread_id=q.thread_id, strategy=q.strategy, position=q.position,
            enqueued_at=q.enqueued_at, prompt=q.prompt) for q in queued])

    async def CancelQueuedRun(self, request: pb.QueueCancelRequest, context: grpc.aio.ServicerContext[Any, Any]
                              ) -> pb.QueueCancelResponse:
        t = self._tenant(context)
        run_id = validate_id(request.run_id, "run_id")
        if not await self._svc.cancel_queued(t, validate_id(request.thread_id, "thread_id"), run_id):
            raise e.UnknownRun(run_id)
        return pb.QueueCancelResponse()

    async def ListAgents(self, request: pb.AgentListRequest, context: grpc.aio.ServicerContext[Any, Any]
                         ) -> pb.AgentListResponse:
        self._tenant(context)
        default, items = self._svc.list_agents()
        return pb.AgentListResponse(default_kind=default, agents=[pb.AgentInfo(**i) for i in items])


def _guard(fn: Handler, request_type: type[Message], authenticate: Callable[[Any], object],
           metrics: Any = None) -> Handler:
    """The method ``fn`` as served: credentials checked, then the request decoded, then the
    call; what it raises mapped to its gRPC status (never a stack trace to the client) and
    counted in ``metrics`` (``baton_gateway_rejected_requests_total{edge="grpc"}``).

    The request arrives as bytes (no ``request_deserializer``): decoding it here puts the
    credentials first (a caller without them learns nothing about what it sent) and makes an
    undecodable message ``INVALID_ARGUMENT`` instead of grpc's ``UNKNOWN``.
    """

    async def call(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            authenticate(context)
            try:
                request = request_type.FromString(raw)
            except DecodeError:
                raise e.InvalidArgument("request", f"is not a valid {request_type.DESCRIPTOR.full_name} message") from None
            return await fn(request, context)
        except e.BatonError as exc:
            if metrics is not None:
                m = mapping_for(exc.cause if isinstance(exc, StartFailed) else exc)
                metrics.rejected.labels("grpc", m.reason if m is not None else "INTERNAL").inc()
            await context.abort_with_status(grpc_status(exc))  # type: ignore[attr-defined]  # grpc-stubs' aio context lacks it
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("Runs.%s failed", getattr(fn, "__name__", "?"))
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")

    call.__name__ = getattr(fn, "__name__", "call")
    return call


def generic_handler(service: RunsService) -> grpc.GenericRpcHandler[Any, Any]:
    """The method table of ``baton.v1.Runs``. Requests are decoded by :func:`_guard` (after the
    credentials); the streams have no response serializer: they write ``RunEvent`` bytes
    framed by the reader."""
    unary: dict[str, tuple[type[Message], type[Message]]] = {
        "CancelRun": (pb.RunCancelRequest, pb.RunCancelResponse),
        "GetRun": (pb.RunGetRequest, pb.RunInfo),
        "FindActiveRun": (pb.ActiveRunRequest, pb.ActiveRunResponse),
        "GetTranscript": (pb.TranscriptRequest, pb.Transcript),
        "ListRuns": (pb.RunListRequest, pb.RunListResponse),
        "ListAgents": (pb.AgentListRequest, pb.AgentListResponse),
        "ForkThread": (pb.ThreadForkRequest, pb.ThreadForkResponse),
        "DeleteThread": (pb.ThreadDeleteRequest, pb.ThreadDeleteResponse),
        "AnswerApproval": (pb.ApprovalAnswerRequest, pb.ApprovalAnswerResponse),
        "SteerRun": (pb.RunSteerRequest, pb.RunSteerResponse),
        "ListQueuedRuns": (pb.QueueListRequest, pb.QueueListResponse),
        "CancelQueuedRun": (pb.QueueCancelRequest, pb.QueueCancelResponse),
        "KeepRun": (pb.RunKeepRequest, pb.RunKeepResponse),
        "GetMessages": (pb.RunMessagesRequest, pb.RunMessagesPage),
    }
    auth, metrics = service._tenant, service._svc.state.metrics
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(_guard(getattr(service, name), req, auth, metrics),
                                                  response_serializer=resp.SerializeToString)
        for name, (req, resp) in unary.items()
    }
    for name, req in (("StartRun", pb.RunStartRequest), ("JoinRun", pb.RunJoinRequest)):
        handlers[name] = grpc.unary_stream_rpc_method_handler(_guard(getattr(service, name), req, auth, metrics),
                                                              response_serializer=None)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


class RunsServer:
    """The gateway's gRPC server: ``baton.v1.Runs``, health and reflection.

    Lifecycle: ``await start()`` (binds; raises ``OSError`` when it cannot), ``await stop()``
    (idempotent: NOT_SERVING, then open streams end within ``grace`` seconds, so readers
    unregister their presence and their runs detach rather than stop). With ``tls``
    enabled the port serves TLS (no client certificates: API keys tell callers apart).
    """

    def __init__(self, service: RunService, listen: str, tls: GrpcTls = PLAINTEXT, *,
                 reuse_port: bool = False) -> None:
        self._service = service
        self._reuse_port = reuse_port
        self._listen = listen
        self._tls = tls
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]  # grpc_health stubs lack .aio
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        # Health and reflection decode their requests in the handler too (Runs does in _guard).
        server = grpc.aio.server(options=_SHARED_PORT if self._reuse_port else _OPTIONS, interceptors=[DecodeCheck()])
        server.add_generic_rpc_handlers((generic_handler(RunsService(self._service)),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server)
        self.port = add_port(server, self._listen, self._tls, "BATON_GATEWAY_TLS_CERT")
        if self.port == 0:
            raise OSError(f"cannot bind {self._listen}")
        await server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("gRPC Runs API listening on port %s", self.port)

    async def stop(self, grace: float = 2.0) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        await self._health.enter_graceful_shutdown()
        await server.stop(grace)
