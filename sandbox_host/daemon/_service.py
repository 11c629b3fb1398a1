"""The gRPC service ``baton.v1.SandboxDaemon``: a sandbox's files and processes, from inside.

What each call does is :class:`sandbox_host.daemon._ops.SandboxOps`'s (a host on a local
sandbox's machine makes the same calls without the daemon); its errors are mapped here, once: a path refused is ``INVALID_ARGUMENT`` (malformed) or
``PERMISSION_DENIED`` (outside the roots), a missing file ``NOT_FOUND``, a launch or a command
that could not start ``FAILED_PRECONDITION``. Messages never hold the launch's secrets.
"""
from __future__ import annotations

import asyncio
import io
import logging
import os
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, NoReturn

import grpc

from baton.errors import SandboxBuildFailed
from baton.v1 import sandbox_daemon_pb2 as pb
from baton.v1 import sandbox_daemon_pb2_grpc as pb_grpc
from sandbox_host.daemon import FOLLOWING, _procs
from sandbox_host.daemon._certs import CertRefused, ServedCert
from sandbox_host.daemon._files import CHUNK, follow_file, size_at_least
from sandbox_host.daemon._ops import SandboxOps
from sandbox_host.daemon._wire import Chunk, encode_chunk
from sandbox_host.daemon.paths import PathRefused
from sandbox_host.providers._inotify import FileWatcher
from sandbox_host.providers._redact import redact

log = logging.getLogger("baton.sandbox_daemon")
Ctx = grpc.aio.ServicerContext[Any, Any]


async def _refuse(context: Ctx, exc: PathRefused) -> NoReturn:
    code = grpc.StatusCode.PERMISSION_DENIED if exc.outside else grpc.StatusCode.INVALID_ARGUMENT
    await context.abort(code, str(exc))
    raise AssertionError("abort returned")  # abort raises; for the type checker


class SandboxDaemonService(pb_grpc.SandboxDaemonServicer):
    """Servicer over a sandbox's roots.

    Args:
        roots: absolute directories every path must lie in.
        workdir: relative paths are taken from here (default: the first root); the agent's
            default working directory.
        state_dir: the wrapper, nonce files, prompts, inboxes and the pgid record (default
            ``<first root>/.baton``).
        idle_check: seconds a follow waits for an inotify wake-up before it looks anyway.
    """

    def __init__(self, roots: list[str], workdir: str | None = None, state_dir: str | None = None,
                 idle_check: float = 0.25) -> None:
        #: The operations this service carries (paths confined, errors Python's own).
        self.ops = SandboxOps(roots, workdir, state_dir)
        self.roots, self.workdir, self.state_dir = self.ops.roots, self.ops.workdir, self.ops.state_dir
        self.idle_check = idle_check
        self.started_at = time.time()
        #: When the last call came in (monotonic seconds), and how many follows are open: a
        #: daemon with ``--idle-exit`` stops once neither it nor its agent did anything.
        self.last_call = time.monotonic()
        self.following = 0
        self._watcher = FileWatcher()
        #: The certificate served, when the daemon serves TLS (set by its server).
        self.certs: ServedCert | None = None

    def idle_for(self) -> float:
        """Seconds since the last call, 0 while a follow is open."""
        return 0.0 if self.following else time.monotonic() - self.last_call

    def _path(self, path: str) -> str:
        return self.ops.path(path)

    async def ReadFile(self, request: pb.ReadFileRequest, context: Ctx) -> AsyncIterator[Chunk]:
        try:
            path = self._path(request.path)
        except PathRefused as exc:
            await _refuse(context, exc)
        if request.offset < 0 or request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "offset and limit must not be negative")
        pos = request.offset
        if request.follow:
            await context.send_initial_metadata(((FOLLOWING, "1"),))
        self.following += request.follow
        try:
            async for data in follow_file(path, pos, self._watcher, self.idle_check,
                                          follow=request.follow, limit=request.limit):
                pos += len(data)
                # A follow tells the file's size with each chunk: the host's journal lag
                # without a FileSize call per read.
                yield Chunk(data, pos - len(data), size_at_least(path, pos) if request.follow else 0)
        except FileNotFoundError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{request.path[:200]}: no such file")
        except IsADirectoryError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{request.path[:200]} is a directory")
        except PermissionError as exc:  # not a regular file (a FIFO would hold the open), unreadable
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc)[:300])
        finally:
            self.following -= request.follow
            self.last_call = time.monotonic()

    async def FileSize(self, request: pb.FileSizeRequest, context: Ctx) -> pb.FileSizeResponse:
        try:
            path = self._path(request.path)
        except PathRefused as exc:
            await _refuse(context, exc)
        try:
            return pb.FileSizeResponse(exists=True, size=os.stat(path).st_size)
        except (FileNotFoundError, NotADirectoryError):
            return pb.FileSizeResponse(exists=False)

    async def CopyIn(self, request: pb.CopyInRequest, context: Ctx) -> pb.CopyInResponse:
        try:
            await self.ops.copy_in(request.path, request.content, request.mode)
        except PathRefused as exc:
            await _refuse(context, exc)
        return pb.CopyInResponse()

    async def Launch(self, request: pb.LaunchRequest, context: Ctx) -> pb.LaunchResponse:
        secrets: Mapping[str, str] = dict(request.secrets)
        try:
            pgid, inbox = await self.ops.launch(
                list(request.argv), nonce=request.nonce, journal_path=request.journal_path,
                stderr_path=request.stderr_path, stdin=request.stdin if request.has_stdin else None,
                env=dict(request.env), secrets=secrets, interactive=request.interactive, home=request.home,
                workdir=request.workdir)
        except PathRefused as exc:
            await _refuse(context, exc)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, redact(str(exc), secrets)[:300])
        except (_procs.LaunchFailed, OSError) as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, redact(f"launch failed: {exc}", secrets))
        return pb.LaunchResponse(pgid=pgid, inbox=inbox)

    async def SendInput(self, request: pb.SendInputRequest, context: Ctx) -> pb.SendInputResponse:
        try:
            await self.ops.send_input(request.inbox, request.line)
        except FileNotFoundError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{request.inbox[:200]}: no such inbox")
        except PermissionError as exc:  # a link or a FIFO where the inbox was
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc)[:300])
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)[:300])
        return pb.SendInputResponse()

    async def Kill(self, request: pb.KillRequest, context: Ctx) -> pb.KillResponse:
        return pb.KillResponse(signalled=await self.ops.kill(request.pgid, request.signal))

    async def Status(self, request: pb.StatusRequest, context: Ctx) -> pb.StatusResponse:
        pgid = self.ops.pgid(request.pgid)
        alive = await self.ops.kill(pgid, 0)
        return pb.StatusResponse(processes_alive=alive, pgid=pgid or 0, started_at=self.started_at,
                                 daemon_pid=os.getpid(), cert_not_after=self.certs.not_after if self.certs else 0.0)

    async def RenewCertificate(self, request: pb.RenewCertificateRequest,
                               context: Ctx) -> pb.RenewCertificateResponse:
        if self.certs is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this daemon serves no TLS")
        try:
            not_after = await asyncio.to_thread(self.certs.renew, request.cert, request.key)
        except CertRefused as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"certificate refused: {exc}")
        log.info("TLS certificate renewed: valid until %s", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(not_after)))
        return pb.RenewCertificateResponse(not_after=not_after)

    async def Exec(self, request: pb.ExecRequest, context: Ctx) -> pb.ExecResponse:
        secrets: Mapping[str, str] = dict(request.secrets)
        try:
            got = await self.ops.exec(list(request.argv), timeout=request.timeout_seconds, workdir=request.workdir,
                                      env=dict(request.env), secrets=secrets, home=request.home,
                                      output_limit=request.output_limit)
        except PathRefused as exc:
            await _refuse(context, exc)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, redact(str(exc), secrets)[:300])
        except OSError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                redact(f"{request.argv[0][:200]!r} did not start: {exc}", secrets))
        return pb.ExecResponse(exit_code=got.exit_code, timed_out=got.timed_out, output=got.output,
                               output_bytes=got.output_bytes)

    async def ExportTree(self, request: pb.ExportTreeRequest, context: Ctx) -> AsyncIterator[pb.TreeChunk]:
        try:
            data = await self.ops.export_tree(request.workdir, request.home)
        except PathRefused as exc:
            await _refuse(context, exc)
        except FileNotFoundError:  # the agent removed its working directory, say
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"{(request.workdir or self.workdir)[:200]}: no such directory")
        except OSError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"the tree cannot be read: {exc}"[:500])
        for i in range(0, len(data), CHUNK):
            yield pb.TreeChunk(data=data[i:i + CHUNK])

    async def ImportTree(self, request_iterator: AsyncIterator[pb.TreeChunk], context: Ctx) -> pb.ImportTreeResponse:
        buf = io.BytesIO()
        first: pb.TreeChunk | None = None
        async for chunk in request_iterator:
            first = first or chunk
            buf.write(chunk.data)
        if first is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an empty import")
        assert first is not None
        try:
            await self.ops.import_tree(buf.getvalue(), workdir=first.workdir, home=first.home, replace=first.replace)
        except PathRefused as exc:
            await _refuse(context, exc)
        except SandboxBuildFailed as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.detail)
        return pb.ImportTreeResponse()


class Activity(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # generic only in grpc-stubs, not at runtime
    """Notes each call's arrival on the service (its idle clock)."""

    def __init__(self, service: SandboxDaemonService) -> None:
        self._service = service

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        self._service.last_call = time.monotonic()
        return await continuation(handler_call_details)


def add_to_server(service: SandboxDaemonService, server: grpc.aio.Server) -> None:
    """Register the servicer on a ``grpc.aio`` server: every method of the service as its
    generated registration does, but ``ReadFile``'s chunks encoded by
    :func:`sandbox_host.daemon._wire.encode_chunk` (the same bytes on the wire)."""
    desc = pb.DESCRIPTOR.services_by_name["SandboxDaemon"]
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for m in desc.methods:
        request, response = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
        handlers[m.name] = kinds[(m.client_streaming, m.server_streaming)](
            getattr(service, m.name), request_deserializer=request.FromString,
            response_serializer=encode_chunk if m.name == "ReadFile" else response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name, handlers),))
