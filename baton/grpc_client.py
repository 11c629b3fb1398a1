"""Async Python client of the gRPC run API (``baton.v1.Runs``), with automatic resume.

Needs only ``grpcio``, ``grpcio-status`` and ``protobuf`` (no server dependencies)::

    async with RunsClient("127.0.0.1:8081", api_key="k1") as runs:
        stream = runs.start("run-1", "thread-1", [{"id": "m1", "role": "user", "content": "hi"}],
                            agent={"kind": "replay",
                                   "journal": "claude-stream-json/partial-messages-bash-exit-128.jsonl"})
        async for chunk in stream:               # resumes on its own after a broken stream
            print(chunk.offset, chunk.event["type"])
        print(stream.status)                     # "completed" | "failed" | "aborted" | "interrupted"
        async for chunk in runs.join("run-1", after="42"): ...
        await runs.cancel(run_id="run-1", wait=True)   # -> RunCancelResponse (run = final RunInfo)
        await runs.get_run("run-1"); await runs.active_run("thread-1"); await runs.transcript("thread-1")
        async for info in runs.list_runs(): ...

Every chunk is yielded exactly once, in order: when a stream breaks (connection lost, the
gateway restarted, its log read failed) the client joins again strictly after the last
offset it yielded. Errors come back as the domain exceptions of :mod:`baton.errors`
(rebuilt from the ``ErrorInfo``, the same table as the servers), or :class:`RunsError`
for the API's own reasons (``UNAUTHENTICATED``, ``NO_HOST_AVAILABLE``, ``BODY_TOO_LARGE``,
``CANCEL_WAIT_TIMEOUT``).
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Sequence

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from baton import errors as e
from baton.grpc_errors import from_rpc_error
from baton.tls import TlsConfigError, read_pem
from baton.v1 import runs_pb2, runs_service_pb2 as pb, runs_service_pb2_grpc as pbg

__all__ = ["Chunk", "RunStream", "RunsClient", "RunsError"]

_OPTIONS = [("grpc.enable_http_proxy", 0)]
# A broken stream is retried with these pauses (seconds); the counter resets on progress.
_BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


class RunsError(e.BatonError):
    """An API error with no domain exception behind it.

    Attributes:
        code: the gRPC status code. reason: the ``ErrorInfo`` reason (same as HTTP's).
        metadata: the ``ErrorInfo`` metadata.
    """

    def __init__(self, code: grpc.StatusCode, reason: str, metadata: Mapping[str, str], message: str) -> None:
        self.code = code
        self.reason = reason
        self.metadata = dict(metadata)
        super().__init__(f"{reason or code.name}: {message}")


def _error(err: grpc.aio.AioRpcError) -> BaseException:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    reason, meta = "", {}
    if status is not None:
        for d in status.details:
            if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                d.Unpack(info)
                reason, meta = info.reason, dict(info.metadata)
    rebuilt = from_rpc_error(err)
    if rebuilt is not err and reason:
        return rebuilt
    return RunsError(err.code(), reason, meta, err.details() or "")


def _resumable(err: grpc.aio.AioRpcError) -> bool:
    # UNAVAILABLE: the connection broke or the gateway's log read failed (LOG_UNAVAILABLE);
    # INTERNAL/UNKNOWN without baton details: an HTTP/2 stream reset mid-stream.
    return err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                          grpc.StatusCode.CANCELLED) and not _has_reason(err, "UNAUTHENTICATED")


def _has_reason(err: grpc.aio.AioRpcError, reason: str) -> bool:
    got = _error(err)
    return isinstance(got, RunsError) and got.reason == reason


@dataclass(frozen=True)
class Chunk:
    """One chunk of a run's log.

    Attributes:
        offset: its position (resume after it).
        json: the AG-UI event's JSON, byte-identical to the SSE ``data:``.
    """

    offset: str
    json: bytes

    @property
    def event(self) -> dict[str, Any]:
        """The AG-UI event, decoded."""
        return json.loads(self.json)  # type: ignore[no-any-return]


class RunStream:
    """The chunks of one run, resumed after the last yielded offset when the stream breaks.

    Attributes:
        run_id: the run.
        last_offset: offset of the last chunk yielded (``None`` before the first).
        status: the log's close status once it closed, else ``None``.
        notice: the last ``(reason, message)`` notice (why no chunk comes, e.g.
            ``LOG_STORAGE_FULL``), cleared when chunks flow again; else ``None``.

    Raises (while iterating):
        OffsetExpired: the position is older than retention.
        The domain exception of any non-transient error (``UnknownRun``, ``ThreadBusy``…).
    """

    def __init__(self, client: "RunsClient", run_id: str, start: pb.RunStartRequest | None, after: str,
                 max_retries: int) -> None:
        self._client = client
        self.run_id = run_id
        self._start = start
        self._after = after
        self._max_retries = max_retries
        self.last_offset: str | None = None
        self.status: str | None = None
        self.notice: tuple[str, str] | None = None
        self.resumes = 0

    def _open(self) -> Any:
        stub, md = self._client._stub, self._client._metadata
        if self.last_offset is not None:
            return stub.JoinRun(pb.RunJoinRequest(run_id=self.run_id, after_offset=self.last_offset), metadata=md)
        if self._start is not None:
            return stub.StartRun(self._start, metadata=md)  # a retry with the same run id joins
        if self._after == "-1":
            return stub.JoinRun(pb.RunJoinRequest(run_id=self.run_id, from_start=True), metadata=md)
        if self._after == "now":
            return stub.JoinRun(pb.RunJoinRequest(run_id=self.run_id, only_new=True), metadata=md)
        return stub.JoinRun(pb.RunJoinRequest(run_id=self.run_id, after_offset=self._after), metadata=md)

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        failures = 0
        while True:
            call = self._open()
            try:
                async for ev in call:
                    if ev.HasField("notice"):
                        self.notice = (ev.notice.reason, ev.notice.message)
                    elif ev.chunks:
                        self.notice = None
                    for c in ev.chunks:
                        self.last_offset = c.offset
                        failures = 0
                        yield Chunk(c.offset, c.json)
                    if ev.HasField("gap"):
                        raise e.OffsetExpired(self.run_id, self.last_offset or self._after, ev.gap.earliest_offset)
                    if ev.HasField("end"):
                        self.status = ev.end.status
                        return
            except grpc.aio.AioRpcError as err:
                if not _resumable(err) or failures >= self._max_retries:
                    raise _error(err) from err
            finally:
                call.cancel()
            # Broken (or ended without its end): join again after the last offset held.
            await asyncio.sleep(_BACKOFF[min(failures, len(_BACKOFF) - 1)])
            failures += 1
            self.resumes += 1


def _credentials(ca_file: str | None, cert_file: str | None, key_file: str | None) -> grpc.ChannelCredentials:
    if bool(cert_file) != bool(key_file):
        raise TlsConfigError("cert_file and key_file go together")
    ca = read_pem("ca_file", ca_file, kind="certificate") if ca_file else None
    cert = read_pem("cert_file", cert_file, kind="certificate") if cert_file else None
    key = read_pem("key_file", key_file, kind="private key") if key_file else None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


class RunsClient:
    """Client of ``baton.v1.Runs``.

    Args:
        target: the gateway's gRPC address (``host:port``).
        api_key: the bearer API key (``BATON_API_KEYS``), or ``None`` without auth.
        channel: use this channel instead of opening one (the client then does not close it).
        max_retries: consecutive resumes without progress before a stream gives up.
        tls: dial TLS (a gateway with ``BATON_GATEWAY_TLS_CERT``, or a TLS ingress),
            checking the server against the system's roots or ``ca_file``.
        ca_file: PEM file of the CA to check the server against (implies ``tls``).
        cert_file, key_file: PEM files of a client certificate and its key, for a proxy in
            front that asks for one (imply ``tls``).

    Raises:
        baton.tls.TlsConfigError: a file unreadable or not PEM of its kind (a ``ValueError``).
    """

    def __init__(self, target: str = "127.0.0.1:8081", *, api_key: str | None = None,
                 channel: grpc.aio.Channel | None = None, max_retries: int = 20,
                 options: Sequence[tuple[str, Any]] = (), tls: bool = False, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None) -> None:
        self._own = channel is None
        if channel is None and (tls or ca_file or cert_file or key_file):
            channel = grpc.aio.secure_channel(target, _credentials(ca_file, cert_file, key_file),
                                              options=[*_OPTIONS, *options])
        self._channel = channel or grpc.aio.insecure_channel(target, options=[*_OPTIONS, *options])
        self._stub = pbg.RunsStub(self._channel)
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._max_retries = max_retries

    async def __aenter__(self) -> "RunsClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own:
            await self._channel.close(None)  # grace=None, the default (grpc-stubs makes it positional)

    async def _unary(self, method: str, request: Any, timeout: float | None = 30.0) -> Any:
        try:
            return await getattr(self._stub, method)(request, metadata=self._metadata, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise _error(err) from err

    # --- streams ----------------------------------------------------------------------

    def start(self, run_id: str, thread_id: str, messages: Sequence[Mapping[str, Any]] = (), *,
              agent: Mapping[str, Any] | None = None, cancel_on_disconnect: bool = False,
              interrupt_active: bool = False, parent_run_id: str = "",
              workspace: Mapping[str, Any] | None = None, multitask: str = "") -> RunStream:
        """Start a run (or join it, when the run id exists) and stream its log from the start.

        ``multitask`` (docs/hitl.md): what a busy thread does with the run: ``reject`` (the
        default: ``ThreadBusy``), ``enqueue`` / ``interrupt`` (the stream waits, then carries
        the run once it started), ``steer`` (the message goes into the active run, whose log
        the stream then carries from its current end).

        Args:
            agent: ``{"kind": ..., **options}`` (e.g. ``{"kind": "replay", "journal": ...}``);
                ``None``: the gateway's default agent.
            workspace: the thread's workspace on its first run, ``{"git", "ref", "credential",
                "setup"}`` or ``{"dir", "setup"}`` (docs/api.md, "Workspaces").
        """
        spec = None
        if agent is not None:
            opts = {k: v for k, v in agent.items() if k != "kind"}
            spec = runs_pb2.AgentSpec(kind=str(agent.get("kind", "")), options_json=json.dumps(opts))
        req = pb.RunStartRequest(thread_id=thread_id, run_id=run_id, messages_json=json.dumps(list(messages)),
                                 agent=spec, cancel_on_disconnect=cancel_on_disconnect,
                                 interrupt_active=interrupt_active, parent_run_id=parent_run_id,
                                 multitask=multitask)
        if workspace is not None:
            req.workspace.CopyFrom(pb.Workspace(**{k: v for k, v in workspace.items() if v is not None}))
        return RunStream(self, run_id, req, "-1", self._max_retries)

    def join(self, run_id: str, after: str = "-1") -> RunStream:
        """The run's log strictly after ``after`` (``"-1"``: from the start; ``"now"``: new chunks only)."""
        return RunStream(self, run_id, None, after, self._max_retries)

    # --- unary ------------------------------------------------------------------------

    async def cancel(self, run_id: str | None = None, thread_id: str | None = None, *, wait: bool = False,
                     timeout: float | None = None) -> pb.RunCancelResponse:
        """Cancel a run (or the thread's active run); with ``wait``, until it is terminal."""
        req = pb.RunCancelRequest(wait=wait, timeout_seconds=timeout or 0)
        if run_id:
            req.run_id = run_id
        elif thread_id:
            req.thread_id = thread_id
        return await self._unary("CancelRun", req, timeout=None if wait else 30.0)  # type: ignore[no-any-return]

    async def get_run(self, run_id: str) -> pb.RunInfo:
        return await self._unary("GetRun", pb.RunGetRequest(run_id=run_id))  # type: ignore[no-any-return]

    async def active_run(self, thread_id: str) -> str | None:
        """The thread's active run id, or ``None``."""
        r = await self._unary("FindActiveRun", pb.ActiveRunRequest(thread_id=thread_id))
        return r.run_id or None

    async def transcript(self, thread_id: str) -> list[dict[str, Any]]:
        """The thread's saved transcript (AG-UI messages)."""
        r = await self._unary("GetTranscript", pb.TranscriptRequest(thread_id=thread_id))
        return json.loads(r.messages_json)  # type: ignore[no-any-return]

    async def fork_thread(self, thread_id: str, run_id: str, new_thread_id: str) -> pb.ThreadForkResponse:
        """A new thread starting where ``run_id`` of ``thread_id`` left its workspace and agent
        session, with the transcript up to it (the source is untouched)."""
        return await self._unary("ForkThread", pb.ThreadForkRequest(  # type: ignore[no-any-return]
            thread_id=thread_id, run_id=run_id, new_thread_id=new_thread_id))

    async def answer_approval(self, run_id: str, approval_id: str, approved: bool, message: str = "",
                              updated_input: Mapping[str, Any] | None = None) -> runs_pb2.RunInput:
        """Answer a tool approval the run's agent asked for (docs/hitl.md); the approval as stored.

        Raises:
            ApprovalNotFound; ApprovalAlreadyAnswered (``approval``: the first answer as JSON
            text); RunEnded; InvalidArgument.
        """
        r = await self._unary("AnswerApproval", pb.ApprovalAnswerRequest(
            run_id=run_id, approval_id=approval_id, approved=approved, message=message,
            updated_input_json=json.dumps(dict(updated_input)) if updated_input is not None else ""))
        return r.approval  # type: ignore[no-any-return]

    async def steer(self, run_id: str, text: str, input_id: str = "") -> str:
        """Send a message into the run's running turn; returns its input id (the same
        ``input_id`` on a retry is delivered once)."""
        r = await self._unary("SteerRun", pb.RunSteerRequest(run_id=run_id, text=text, input_id=input_id))
        return str(r.input_id)

    async def list_queue(self, thread_id: str) -> list[pb.QueuedRunInfo]:
        """The thread's queued runs, next first."""
        r = await self._unary("ListQueuedRuns", pb.QueueListRequest(thread_id=thread_id))
        return list(r.runs)

    async def cancel_queued(self, thread_id: str, run_id: str) -> None:
        """Take a queued run out of its thread's queue (``UnknownRun`` when it is not queued)."""
        await self._unary("CancelQueuedRun", pb.QueueCancelRequest(thread_id=thread_id, run_id=run_id))

    async def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's workspace and saved transcript (``ThreadBusy`` while a run goes)."""
        await self._unary("DeleteThread", pb.ThreadDeleteRequest(thread_id=thread_id))

    async def list_runs(self, thread_id: str = "", page_size: int = 100) -> AsyncIterator[pb.RunInfo]:
        """Every run of the caller (or of one thread), oldest first, page by page."""
        token = ""
        while True:
            page = await self._unary("ListRuns", pb.RunListRequest(thread_id=thread_id, page_size=page_size,
                                                                  page_token=token))
            for r in page.runs:
                yield r
            token = page.next_page_token
            if not token:
                return

    async def agents(self) -> pb.AgentListResponse:
        return await self._unary("ListAgents", pb.AgentListRequest())  # type: ignore[no-any-return]
