"""The gRPC service ``baton.v1.SandboxDaemon``: a sandbox's files and processes, from inside.

Errors are mapped here, once: a path refused is ``INVALID_ARGUMENT`` (malformed) or
``PERMISSION_DENIED`` (outside the roots), a missing file ``NOT_FOUND``, a launch or a command
that could not start ``FAILED_PRECONDITION``. Messages never hold the launch's secrets.
"""
from __future__ import annotations

import asyncio
import io
import logging
import os
import posixpath
import shutil
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, NoReturn

import grpc

from baton.errors import SandboxBuildFailed
from baton.v1 import sandbox_daemon_pb2 as pb
from baton.v1 import sandbox_daemon_pb2_grpc as pb_grpc
from sandbox_host.daemon import FOLLOWING, _exec, _procs
from sandbox_host.daemon._certs import CertRefused, ServedCert
from sandbox_host.daemon._files import CHUNK, follow_file, size_at_least, write_whole
from sandbox_host.daemon._wire import Chunk, encode_chunk
from sandbox_host.daemon.paths import PathRefused, confine, normalize_roots
from sandbox_host.providers import _tree
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
        self.roots = normalize_roots(roots)
        self.workdir = os.path.normpath(workdir) if workdir else self.roots[0]
        self.state_dir = state_dir or os.path.join(self.roots[0], ".baton")
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
        full = confine(path, self.roots, self.workdir)
        # A link inside a root may point out of it: the resolved path is checked too.
        real = os.path.realpath(full)
        if real != full:
            confine(real, tuple(os.path.realpath(r) for r in self.roots), self.workdir)
        return full

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
        except FileNotFoundError:
            return pb.FileSizeResponse(exists=False)

    async def CopyIn(self, request: pb.CopyInRequest, context: Ctx) -> pb.CopyInResponse:
        try:
            path = self._path(request.path)
        except PathRefused as exc:
            await _refuse(context, exc)
        await asyncio.to_thread(write_whole, path, request.content, request.mode or 0o644)
        return pb.CopyInResponse()

    async def Launch(self, request: pb.LaunchRequest, context: Ctx) -> pb.LaunchResponse:
        secrets: Mapping[str, str] = dict(request.secrets)
        if not request.argv:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "argv must not be empty")
        try:
            journal, stderr = self._path(request.journal_path), self._path(request.stderr_path)
            workdir = self._path(request.workdir) if request.workdir else self.workdir
            # Absolute, as for Exec: a handle's home is relative to the sandbox's root (the
            # kubernetes provider's is "home"), and HOME=home would be taken from the agent's
            # working directory by every program that reads it.
            home = self._path(request.home) if request.home else ""
        except PathRefused as exc:
            await _refuse(context, exc)
        spec = _procs.LaunchSpec(
            argv=list(request.argv), nonce=request.nonce, journal_path=journal, stderr_path=stderr,
            workdir=workdir, stdin=request.stdin if request.has_stdin else None, env=dict(request.env),
            secrets=secrets, interactive=request.interactive, home=home)
        try:
            pgid, inbox = await _procs.launch(self.state_dir, spec)
        except (_procs.LaunchFailed, OSError) as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, redact(f"launch failed: {exc}", secrets))
        return pb.LaunchResponse(pgid=pgid, inbox=inbox)

    async def SendInput(self, request: pb.SendInputRequest, context: Ctx) -> pb.SendInputResponse:
        inbox = posixpath.normpath(request.inbox)
        # Inboxes are the daemon's own files: only those in its state directory.
        if (posixpath.dirname(inbox) != posixpath.normpath(self.state_dir)
                or not posixpath.basename(inbox).startswith("inbox-")):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{request.inbox[:200]!r} is not an inbox")
        line = request.line
        if not line.endswith(b"\n") or b"\n" in line[:-1]:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an input is one line ending with a newline")
        try:
            await asyncio.to_thread(_procs.append_line, inbox, line)
        except FileNotFoundError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{request.inbox[:200]}: no such inbox")
        return pb.SendInputResponse()

    def _pgid(self, pgid: int) -> int | None:
        return pgid or _procs.recorded_pgid(self.state_dir)

    async def Kill(self, request: pb.KillRequest, context: Ctx) -> pb.KillResponse:
        pgid = self._pgid(request.pgid)
        done = await asyncio.to_thread(_procs.signal_group, pgid, request.signal)
        return pb.KillResponse(signalled=done)

    async def Status(self, request: pb.StatusRequest, context: Ctx) -> pb.StatusResponse:
        pgid = self._pgid(request.pgid)
        alive = await asyncio.to_thread(_procs.signal_group, pgid, 0)
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
        if not request.argv:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "argv must not be empty")
        if request.timeout_seconds < 0 or request.output_limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "timeout_seconds and output_limit must not be negative")
        try:
            workdir = self._path(request.workdir) if request.workdir else self.workdir
            home = self._path(request.home) if request.home else ""
        except PathRefused as exc:
            await _refuse(context, exc)
        limit = min(request.output_limit or _exec.DEFAULT_LIMIT, _exec.MAX_LIMIT)
        env = _procs.agent_env(os.environ, _procs.LaunchSpec(
            argv=(), nonce="", journal_path="", stderr_path="", workdir=workdir, env=dict(request.env),
            secrets=secrets, home=home))
        try:
            # A secret cut by the tail's start would survive its redaction: a margin is kept.
            margin = max((len(v) for v in secrets.values()), default=0)
            got = await _exec.run(list(request.argv), cwd=workdir, env=env,
                                  timeout=min(request.timeout_seconds or _exec.MAX_TIMEOUT, _exec.MAX_TIMEOUT),
                                  limit=limit + margin)
        except OSError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                redact(f"{request.argv[0][:200]!r} did not start: {exc}", secrets))
        text = _exec.redacted_tail(got.output, secrets, cut=got.output_bytes > len(got.output), limit=limit)
        return pb.ExecResponse(exit_code=got.exit_code, timed_out=got.timed_out, output=text,
                               output_bytes=got.output_bytes)

    def _tree_dirs(self, workdir: str, home: str) -> tuple[str, str | None]:
        return (self._path(workdir) if workdir else self.workdir), (self._path(home) if home else None)

    async def ExportTree(self, request: pb.ExportTreeRequest, context: Ctx) -> AsyncIterator[pb.TreeChunk]:
        try:
            workdir, home = self._tree_dirs(request.workdir, request.home)
        except PathRefused as exc:
            await _refuse(context, exc)
        inside = os.path.commonpath([workdir, self.state_dir]) == workdir
        try:
            data = await asyncio.to_thread(_tree.export_local, workdir, home, self.state_dir if inside else None)
        except FileNotFoundError:  # the agent removed its working directory, say
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{(request.workdir or workdir)[:200]}: no such directory")
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
            workdir, home = self._tree_dirs(first.workdir, first.home)
        except PathRefused as exc:
            await _refuse(context, exc)
        data = buf.getvalue()
        try:
            # Checked whole before anything is emptied or written.
            await asyncio.to_thread(_tree.renamed_for_put, data, {"work": "w", **({"home": "h"} if home else {})})
            if first.replace:
                await asyncio.to_thread(_empty, workdir, home, self.state_dir)
            await asyncio.to_thread(_tree.import_local, data, workdir, home)
        except SandboxBuildFailed as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.detail)
        return pb.ImportTreeResponse()


def _empty(workdir: str, home: str | None, keep: str) -> None:
    """Empty both directories, keeping ``keep`` (the daemon's state) where it lies in one."""
    for top in (workdir, home):
        if not top or not os.path.isdir(top):
            continue
        for name in os.listdir(top):
            path = os.path.join(top, name)
            if path == keep:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)


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
