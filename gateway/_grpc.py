"""``baton.v1.Runs``: the public run API over gRPC, the twin of the HTTP routes (docs/design.md §6).

Served from the gateway process on its own port and sharing the app's state: every
operation calls the same functions as its HTTP route (start path, cancel, views, the
tenant checks), and streams are served by the same reader (:func:`gateway._reader.stream_log`,
with its shared tail, presence and takeover trigger) in the ``grpc`` framing, whose frames
are ``RunEvent`` wire bytes (:mod:`gateway._grpc_wire`) sent without re-encoding.

Auth: ``authorization: Bearer <key>`` metadata maps to a tenant exactly as the HTTP header
does (``BATON_API_KEYS``); health and reflection on this port need no credentials.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Awaitable, Callable

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from baton import errors as e
from baton.ids import page_position, page_token, run_position, validate_id
from baton.v1 import runs_pb2, runs_service_pb2 as pb
from gateway import _grpc_wire
from gateway._auth import tenant_of_header
from gateway._errors import BodyTooLarge, grpc_status
from gateway._reader import stream_log
from gateway._routes_chat import cancel_run, check_cancel_timeout, log_gone, open_start, visible_active
from gateway._routes_misc import agent_list
from gateway._state import GatewayState
from gateway._validate import MAX_JSON_DEPTH, _depth, check_chat_start, check_offset
from gateway._views import join_view_for, load_thread_transcript, settled_view_for, thread_visible_for

log = logging.getLogger("gateway.grpc")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Runs"].full_name
DEFAULT_PAGE = 100
MAX_PAGE = 1000
_OPTIONS = [("grpc.so_reuseport", 0)]


def run_info(record: runs_pb2.RunRecord, claim: Any | None = None, reap_at: float | None = None) -> pb.RunInfo:
    """The public view of a run (the fields of ``GET /api/runs/{runId}``)."""
    info = pb.RunInfo(
        run_id=record.run_id, thread_id=record.thread_id, status=record.status,
        epoch=int(claim.epoch) if claim is not None else int(record.driver_epoch),
        driver_host=(claim.host_id if claim is not None and claim.host_id else record.driver_host),
        claimed=claim is not None, cancel_requested=record.cancel_requested, agent=record.agent.kind,
    )
    for name in ("started_at", "finished_at", "detached_since"):
        if record.HasField(name):
            setattr(info, name, getattr(record, name))
    if reap_at is not None:
        info.reap_at = reap_at
    if record.HasField("error") and (record.error.message or record.error.code):
        info.error.CopyFrom(record.error)
    return info


def _position(record: runs_pb2.RunRecord) -> bytes:
    return run_position(record.started_at, record.run_id)


def _parse_messages(raw: str) -> Any:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        raise e.InvalidArgument("messages_json", "must be a JSON array") from None
    except RecursionError:
        raise e.InvalidArgument("messages_json", f"must not nest deeper than {MAX_JSON_DEPTH} levels") from None
    if isinstance(value, (list, dict)) and _depth(value) > MAX_JSON_DEPTH:
        raise e.InvalidArgument("messages_json", f"must not nest deeper than {MAX_JSON_DEPTH} levels")
    return value


def _parse_agent(spec: runs_pb2.AgentSpec) -> Any:
    if not spec.kind and not spec.options_json:
        return None
    options: Any = {}
    if spec.options_json:
        try:
            options = json.loads(spec.options_json)
        except (ValueError, RecursionError):
            raise e.InvalidArgument("agent.options_json", "must be a JSON object") from None
        if not isinstance(options, dict):
            raise e.InvalidArgument("agent.options_json", "must be a JSON object")
    return {**options, "kind": spec.kind}


def workspace_of(ws: pb.Workspace) -> dict[str, Any]:
    """A ``Workspace`` message as the HTTP body's ``workspace`` object (unset fields left out)."""
    out: dict[str, Any] = {k: v for k, v in (("git", ws.git), ("ref", ws.ref), ("credential", ws.credential),
                                              ("dir", ws.dir)) if v}
    if ws.setup:
        out["setup"] = list(ws.setup)
    return out


Handler = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


class RunsService:
    """The ``baton.v1.Runs`` methods over one gateway's state.

    Every method maps domain errors to their status with ``ErrorInfo`` (:func:`grpc_status`)
    and a bug to ``INTERNAL`` (logged; the server goes on).
    """

    def __init__(self, state: GatewayState) -> None:
        self._st = state

    def _tenant(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        header = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
        return tenant_of_header(header, self._st.settings.api_keys)

    async def _stream(self, context: grpc.aio.ServicerContext[Any, Any], run_id: str, after: str,
                      on_disconnect: Callable[[], Awaitable[None]] | None, *, gone: bool = False) -> None:
        """Write the log's frames; a stream that ends without end/gap fails UNAVAILABLE."""
        body = stream_log(self._st, run_id, after, "grpc", on_disconnect=on_disconnect, gone=gone)
        finished = False
        try:
            async for frame in body:
                await context.write(frame)
                if frame and frame[0] in (_grpc_wire.END_TAG, _grpc_wire.GAP_TAG):
                    finished = True
        finally:
            await body.aclose()
        if not finished:
            # The log read failed (NATS away): the client joins again after its last offset.
            raise e.LogUnavailable(run_id, "the log read ended early; join again after the last offset")

    # --- streams ------------------------------------------------------------------------

    async def StartRun(self, request: pb.RunStartRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        st = self._st
        t = self._tenant(context)
        if request.ByteSize() > st.settings.max_body_bytes:
            raise BodyTooLarge(st.settings.max_body_bytes)
        body: dict[str, Any] = {
            "threadId": request.thread_id or None,
            "runId": request.run_id or None,
            "messages": _parse_messages(request.messages_json),
            "agent": _parse_agent(request.agent),
            "detachOnDisconnect": not request.cancel_on_disconnect,
            "interruptActive": request.interrupt_active,
            "parentRunId": request.parent_run_id or None,
            "workspace": workspace_of(request.workspace) if request.HasField("workspace") else None,
        }
        cs = check_chat_start(body, {}, {}, replay_dirs=st.settings.replay_dirs,
                              default_agent=st.settings.default_agent, max_messages=st.settings.max_messages,
                              workspace_dirs=st.settings.workspace_dirs)
        after, on_disconnect = await open_start(st, cs, t, "-1")
        await context.send_initial_metadata((("x-run-id", cs.run_id),))
        await self._stream(context, cs.run_id, after, on_disconnect)

    async def JoinRun(self, request: pb.RunJoinRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        st = self._st
        t = self._tenant(context)
        run_id = validate_id(request.run_id, "runId")
        position = request.WhichOneof("position")
        if position == "after_offset":
            after = check_offset(request.after_offset)
        elif position == "only_new" and request.only_new:
            after = "now"
        else:
            after = "-1"
        view = await join_view_for(st, t, run_id)
        st.takeovers.consider(run_id, view.record if view else None, view.claim if view else None)
        await self._stream(context, run_id, after, None, gone=view is not None and await log_gone(st, view.record))

    # --- unary --------------------------------------------------------------------------

    async def CancelRun(self, request: pb.RunCancelRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RunCancelResponse:
        st = self._st
        t = self._tenant(context)
        target = request.WhichOneof("target")
        timeout = check_cancel_timeout(request.timeout_seconds or None, st.settings.cancel_wait)
        run_id, view, confirmation = await cancel_run(
            st, t, request.run_id if target == "run_id" else None,
            request.thread_id if target == "thread_id" else None, wait=request.wait, timeout=timeout)
        out = pb.RunCancelResponse(run_id=run_id, cancel_requested=True)
        if view is not None:
            out.run.CopyFrom(run_info(view.record, view.claim, view.reap_at))
            out.confirmation_json = json.dumps(confirmation, separators=(",", ":")) if confirmation is not None else ""
        return out

    async def GetRun(self, request: pb.RunGetRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RunInfo:
        t = self._tenant(context)
        view = await settled_view_for(self._st, t, validate_id(request.run_id, "runId"))
        return run_info(view.record, view.claim, view.reap_at)

    async def FindActiveRun(self, request: pb.ActiveRunRequest, context: grpc.aio.ServicerContext[Any, Any]
                            ) -> pb.ActiveRunResponse:
        t = self._tenant(context)
        rec = await visible_active(self._st, t, validate_id(request.thread_id, "threadId"))
        return pb.ActiveRunResponse(run_id=rec.run_id if rec is not None else "")

    async def GetTranscript(self, request: pb.TranscriptRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.Transcript:
        st = self._st
        t = self._tenant(context)
        thread_id = validate_id(request.thread_id, "threadId")
        msgs, revision = await load_thread_transcript(st, t, thread_id)
        return pb.Transcript(thread_id=thread_id, messages_json=json.dumps(msgs, separators=(",", ":")),
                             revision=revision or 0)

    async def ListRuns(self, request: pb.RunListRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RunListResponse:
        st = self._st
        t = self._tenant(context)
        if request.page_size < 0 or request.page_size > MAX_PAGE:
            raise e.InvalidArgument("page_size", f"must be in [0, {MAX_PAGE}]")
        size = request.page_size or DEFAULT_PAGE
        thread_id = validate_id(request.thread_id, "threadId") if request.thread_id else None
        # Tenant-scoped in the store read (auth off: the empty tenant reads every run).
        scope = t if st.settings.auth_enabled else None
        if not thread_id:
            # One page from the coordinator's started index: one call never reads every run.
            recs, token = await st.coordinator.list_page(scope, size, request.page_token)
            return pb.RunListResponse(runs=[run_info(r) for r in recs], next_page_token=token)
        # A thread's runs are few (one runs at a time): read them and page here, with
        # tokens of the same form (the position of the page's last run).
        after = page_position(request.page_token) if request.page_token else None
        await thread_visible_for(st, t, thread_id, must_exist=False)
        recs = sorted(await st.coordinator.list_runs(thread_id=thread_id, limit=0, tenant=scope), key=_position)
        if after is not None:
            recs = [r for r in recs if _position(r) > after]
        page = recs[:size]
        token = page_token(_position(page[-1])) if len(recs) > size else ""
        return pb.RunListResponse(runs=[run_info(r) for r in page], next_page_token=token)

    async def ListAgents(self, request: pb.AgentListRequest, context: grpc.aio.ServicerContext[Any, Any]
                         ) -> pb.AgentListResponse:
        self._tenant(context)
        items = agent_list(self._st.settings.replay_dirs)
        return pb.AgentListResponse(default_kind=self._st.settings.default_agent,
                                    agents=[pb.AgentInfo(**i) for i in items])


def _guard(fn: Handler) -> Handler:
    """Map what a method raises to its gRPC status (never a stack trace to the client)."""

    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await fn(request, context)
        except e.BatonError as exc:
            await context.abort_with_status(grpc_status(exc))  # type: ignore[attr-defined]  # grpc-stubs' aio context lacks it
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("Runs.%s failed", getattr(fn, "__name__", "?"))
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")

    call.__name__ = getattr(fn, "__name__", "call")
    return call


def generic_handler(service: RunsService) -> grpc.GenericRpcHandler[Any, Any]:
    """The method table of ``baton.v1.Runs``. The streams have no response serializer: they
    write ``RunEvent`` bytes framed by the reader."""
    unary: dict[str, tuple[type[Message], type[Message]]] = {
        "CancelRun": (pb.RunCancelRequest, pb.RunCancelResponse),
        "GetRun": (pb.RunGetRequest, pb.RunInfo),
        "FindActiveRun": (pb.ActiveRunRequest, pb.ActiveRunResponse),
        "GetTranscript": (pb.TranscriptRequest, pb.Transcript),
        "ListRuns": (pb.RunListRequest, pb.RunListResponse),
        "ListAgents": (pb.AgentListRequest, pb.AgentListResponse),
    }
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(_guard(getattr(service, name)), request_deserializer=req.FromString,
                                                  response_serializer=resp.SerializeToString)
        for name, (req, resp) in unary.items()
    }
    for name, req in (("StartRun", pb.RunStartRequest), ("JoinRun", pb.RunJoinRequest)):
        handlers[name] = grpc.unary_stream_rpc_method_handler(_guard(getattr(service, name)),
                                                              request_deserializer=req.FromString,
                                                              response_serializer=None)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


class RunsServer:
    """The gateway's gRPC server: ``baton.v1.Runs``, health and reflection.

    Lifecycle: ``await start()`` (binds; raises ``OSError`` when it cannot), ``await stop()``
    (idempotent: NOT_SERVING, then open streams end within ``grace`` seconds, so readers
    unregister their presence and their runs detach rather than stop).
    """

    def __init__(self, state: GatewayState, listen: str) -> None:
        self._state = state
        self._listen = listen
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]  # grpc_health stubs lack .aio
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        server = grpc.aio.server(options=_OPTIONS)
        server.add_generic_rpc_handlers((generic_handler(RunsService(self._state)),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server)
        self.port = server.add_insecure_port(self._listen)
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
