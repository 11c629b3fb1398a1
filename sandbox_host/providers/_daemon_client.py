"""A sandbox's daemon seen from a host: the provider I/O methods over ``baton.v1.SandboxDaemon``.

A provider decides how a sandbox is created and destroyed and where its daemon listens; every
read, follow, launch, input and signal then goes through a :class:`DaemonClient`
(docs/design.md §5.1). The daemon may restart under a run (its agent lives on): a call that
finds it unreachable asks the provider where it listens now and tries again, within
``patience`` seconds, unless the provider says the sandbox is gone; a follow resumes from the
offset it had reached, so no byte is lost or read twice.
"""
from __future__ import annotations

import asyncio
import io
import time
from typing import AsyncGenerator, Awaitable, Callable, Mapping, Sequence, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from baton import internal_auth
from baton.retry import Attempts, Deadline
from baton import tls as _tls
from baton.errors import SandboxBuildFailed
from baton.v1 import sandbox_daemon_pb2 as pb
from baton.v1 import sandbox_daemon_pb2_grpc as pb_grpc
from sandbox_host.daemon import FOLLOWING, SERVICE_NAME
from sandbox_host.daemon._wire import Chunk, decode_chunk
from sandbox_host.providers._redact import redact

T = TypeVar("T")
_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20), ("grpc.http2.max_frame_size", (1 << 24) - 1)]
#: Seconds one unary call may take (a launch waits for its process group; an export reads a tree).
_CALL_TIMEOUT = 30.0
_TREE_CHUNK = 1 << 20
# Pauses between tries while the daemon is unreachable: from 20 ms up to 0.5 s.
_BACKOFF = (0.02, 0.5)
_RETRY = (grpc.StatusCode.UNAVAILABLE,)


def _stub_of(channel: grpc.aio.Channel) -> pb_grpc.SandboxDaemonStub:
    """The generated stub, but ``ReadFile``'s chunks decoded by
    :func:`sandbox_host.daemon._wire.decode_chunk` (one copy of the bytes, not two)."""
    stub = pb_grpc.SandboxDaemonStub(channel)
    stub.ReadFile = channel.unary_stream(  # yields Chunk (data, offset), as FileChunk's fields
        "/baton.v1.SandboxDaemon/ReadFile", request_serializer=pb.ReadFileRequest.SerializeToString,
        response_deserializer=decode_chunk)
    return stub


class DaemonUnreachable(OSError):
    """The sandbox's daemon did not answer within the client's patience (the sandbox still
    exists, as far as the provider can tell)."""


class SandboxGone(FileNotFoundError):
    """The daemon is unreachable and the provider says the sandbox no longer exists."""


class _NoAddress(Exception):
    """The provider could not say where the daemon listens (tried again, as unreachable)."""


async def _never_gone() -> bool:
    return False


#: Words of a gRPC error whose TLS handshake failed: permanent (another CA, another
#: sandbox's certificate, a daemon without TLS), so not worth waiting out.
_HANDSHAKE_FAILED = ("handshake failed", "certificate_verify_failed", "peer name", "wrong_version_number")


def tls_refusal(exc: BaseException, address: str) -> DaemonUnreachable | None:
    """The clear error for a call whose TLS handshake with the daemon failed, else ``None``.
    The handshake's own words are kept (they hold no key material)."""
    if not isinstance(exc, grpc.aio.AioRpcError) or exc.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    details = exc.details() or ""
    at = [details.lower().find(w) for w in _HANDSHAKE_FAILED if w in details.lower()]
    if not at:
        return None
    why = details[min(at):]
    return DaemonUnreachable(f"sandbox daemon at {address}: its TLS certificate was refused (not signed by the "
                             f"sandbox CA BATON_SANDBOX_CA_CERT, not this sandbox's, or no TLS): {why.strip()[:300]}")


async def _reached(stream: grpc.aio.UnaryStreamCall[pb.ReadFileRequest, pb.FileChunk]) -> bool:
    """Whether the daemon took the ended follow ``stream`` (its initial metadata says ``FOLLOWING``)."""
    try:
        async with asyncio.timeout(1.0):  # the call has ended: its metadata is there or never comes
            md = await stream.initial_metadata()
    except (TimeoutError, grpc.aio.AioRpcError, grpc.aio.UsageError):
        return False
    return any(key == FOLLOWING for key, _ in (md or ()))


class DaemonClient:
    """The I/O of one sandbox through its daemon.

    Args:
        resolve: where the daemon listens now (``host:port``); asked again after the
            daemon was unreachable (a restarted local daemon has a new port).
        token: the sandbox daemon's token (:func:`sandbox_host.daemon.sandbox_token`); ``""``
            sends none.
        tls: the link's TLS (:data:`baton.tls.PLAINTEXT` for a daemon that serves none).
        gone: whether the sandbox no longer exists (asked while the daemon is unreachable).
        patience: seconds a call keeps trying an unreachable daemon.
    """

    def __init__(self, resolve: Callable[[], Awaitable[str]], *, token: str = "",
                 tls: _tls.GrpcTls = _tls.PLAINTEXT, gone: Callable[[], Awaitable[bool]] = _never_gone,
                 patience: float = 30.0) -> None:
        self._resolve = resolve
        self._token = token
        self._tls = tls
        self._gone = gone
        self.patience = patience
        self._channel: grpc.aio.Channel | None = None
        self._stub_cache: pb_grpc.SandboxDaemonStub | None = None  # the current channel's
        self._address = ""
        self._old: list[grpc.aio.Channel] = []

    async def _stub(self) -> pb_grpc.SandboxDaemonStub:
        if self._channel is None:
            try:
                self._address = await self._resolve()
            except SandboxGone:
                raise
            except OSError as exc:  # e.g. a restarting daemon has not written its address yet
                raise _NoAddress(str(exc)) from exc
            self._channel = internal_auth.channel(self._address, _OPTIONS, token=self._token, tls=self._tls)
            # One stub per channel: a stub builds a multi-callable per method of the service.
            self._stub_cache = _stub_of(self._channel)
        assert self._stub_cache is not None
        return self._stub_cache

    def _forget(self) -> None:
        # Closed at close(): a stream still reading on the old channel ends on its own error.
        if self._channel is not None:
            self._old.append(self._channel)
            self._channel = None

    async def close(self) -> None:
        """Close the channels (idempotent)."""
        channels, self._old = [*self._old, *([self._channel] if self._channel else [])], []
        self._channel = None
        for ch in channels:
            await ch.close(None)

    def _attempts(self) -> Attempts:
        """A fresh budget of ``patience`` seconds for reaching the daemon (the project's
        retry schedule: pauses from 0.02 s doubling to 0.5 s)."""
        return Attempts(Deadline.after(self.patience), first_pause=_BACKOFF[0], max_pause=_BACKOFF[1])

    async def _unreachable(self, attempts: Attempts, exc: BaseException) -> None:
        """After an unreachable try: raise when gone or out of patience, else pause."""
        self._forget()
        refused = tls_refusal(exc, self._address)
        if refused is not None:
            raise refused from None
        if await self._gone():
            raise SandboxGone(f"sandbox daemon at {self._address}: the sandbox is gone") from exc
        pause = attempts.next_pause()
        if pause is None:
            raise DaemonUnreachable(f"sandbox daemon at {self._address} unreachable for {self.patience:.0f} s") from exc
        await attempts.sleep(pause)

    async def _call(self, call: Callable[[pb_grpc.SandboxDaemonStub], Awaitable[T]], *, retry: bool = True) -> T:
        """``call`` on the daemon, tried again while it is unreachable.

        Raises:
            PermissionError: a path outside the sandbox's roots.
            ValueError: a request the daemon refused as malformed (``..`` in a path, say).
            grpc.aio.AioRpcError: any other refusal (the caller maps it).
            SandboxGone: the client was closed under the call and the sandbox is gone (it
                was being destroyed).
            OSError: the client was closed under the call otherwise.
        """
        attempts = self._attempts()
        while True:
            try:
                return await call(await self._stub())
            except asyncio.CancelledError:
                # As in follow: the channel closed under a call in flight, not this task cancelled.
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                if await self._gone():
                    raise SandboxGone(f"sandbox daemon at {self._address}: the sandbox is gone") from None
                raise OSError(f"sandbox daemon at {self._address}: the client was closed") from None
            except _NoAddress as exc:
                await self._unreachable(attempts, exc)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise PermissionError(exc.details()) from None
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise ValueError(exc.details()) from None
                if exc.code() not in _RETRY or not retry:
                    raise
                await self._unreachable(attempts, exc)

    async def wait_serving(self, timeout: float) -> None:
        """Wait until the daemon's health says SERVING.

        Raises:
            DaemonUnreachable: not within ``timeout`` seconds, or at once when the TLS handshake
                fails (:func:`tls_refusal`).
            SandboxGone: the provider says the sandbox is gone.
        """
        deadline = time.monotonic() + timeout
        why = ""
        while True:
            try:
                await self._stub()
                assert self._channel is not None
                got = await health_pb2_grpc.HealthStub(self._channel).Check(
                    health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=max(0.1, min(2.0, deadline - time.monotonic())))
                if got.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                why = f"health {got.status}"
            except (grpc.aio.AioRpcError, _NoAddress) as exc:
                why = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                self._forget()
                refused = tls_refusal(exc, self._address)
                if refused is not None:
                    raise refused from None
            if await self._gone():
                raise SandboxGone(f"sandbox daemon at {self._address}: the sandbox is gone")
            if time.monotonic() > deadline:
                # The last reason (no address: the provider's own, e.g. the daemon's log tail).
                raise DaemonUnreachable(f"sandbox daemon at {self._address} not serving within {timeout:.0f} s"
                                        + (f": {why[:500]}" if why else ""))
            await asyncio.sleep(0.02)

    # --- files ------------------------------------------------------------------------------

    async def follow(self, path: str, offset: int) -> AsyncGenerator[Chunk, None]:
        """Yield the file's bytes from ``offset`` as they are written (never ends by itself),
        each :class:`~sandbox_host.daemon._wire.Chunk` with the file's size when it was read
        (0 from a daemon that does not tell); a restarted daemon is followed on from the
        offset reached.

        Raises:
            FileNotFoundError: the file does not exist or was deleted (``SandboxGone``: the
                sandbox is gone).
            DaemonUnreachable: the daemon stayed unreachable for ``patience`` seconds (counted
                from the first failed try after the follow last had the daemon, by a chunk or
                by its answer to the follow (``FOLLOWING``), not from the last chunk: a follow
                silent for longer than that still waits out a restart, and another later).
        """
        pos = offset
        # Made at the first failure after progress (not per chunk: a catch-up gets hundreds
        # a second, and a budget started at the last chunk would be spent by a quiet agent).
        attempts: Attempts | None = None

        async def budget(stream: grpc.aio.UnaryStreamCall[pb.ReadFileRequest, pb.FileChunk] | None) -> Attempts:
            # A follow the daemon had taken (its initial metadata came; the call has ended, so
            # this answers at once) reached it: what an earlier outage left is not spent on this one.
            nonlocal attempts
            if attempts is None or (stream is not None and await _reached(stream)):
                attempts = self._attempts()
            return attempts
        while True:
            try:
                stub = await self._stub()
            except _NoAddress as exc:
                await self._unreachable(await budget(None), exc)
                continue
            stream = stub.ReadFile(pb.ReadFileRequest(path=path, offset=pos, follow=True))
            try:
                async for chunk in stream:
                    if chunk.offset != pos:  # never: the daemon answers from where it was asked
                        raise OSError(f"{path}: the daemon sent offset {chunk.offset}, expected {pos}")
                    pos += len(chunk.data)
                    attempts = None
                    yield chunk
                # A follow never ends by itself: an end is the daemon going away.
                await self._unreachable(await budget(stream), EOFError(path))
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # this follow was cancelled
                # The channel was closed under the stream (the sandbox is being destroyed).
                if await self._gone():
                    raise SandboxGone(f"{path}: the sandbox is gone") from None
                raise OSError(f"following {path}: the client was closed") from None
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    raise FileNotFoundError(path) from None
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise PermissionError(exc.details()) from None
                if exc.code() not in (*_RETRY, grpc.StatusCode.CANCELLED):  # CANCELLED: a daemon stopping
                    raise OSError(f"following {path} failed: {exc.code().name}: {exc.details()}") from None
                await self._unreachable(await budget(stream), exc)
            finally:
                stream.cancel()

    async def read_file(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of a file from ``offset`` (at most ``limit``).

        Raises:
            FileNotFoundError: the file does not exist.
        """
        async def call(stub: pb_grpc.SandboxDaemonStub) -> bytes:
            out = bytearray()
            async for chunk in stub.ReadFile(pb.ReadFileRequest(path=path, offset=offset, limit=limit or 0),
                                             timeout=_CALL_TIMEOUT):
                out += chunk.data
            return bytes(out)

        if limit == 0:
            return b""
        try:
            return await self._call(call)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise FileNotFoundError(path) from None
            raise OSError(f"reading {path} failed: {exc.code().name}: {exc.details()}") from None

    async def file_size(self, path: str) -> int | None:
        """Size in bytes, ``None`` when the file does not exist (or the sandbox is gone)."""
        try:
            got = await self._call(lambda s: s.FileSize(pb.FileSizeRequest(path=path), timeout=_CALL_TIMEOUT))
        except SandboxGone:
            return None
        return got.size if got.exists else None

    async def copy_in(self, path: str, content: bytes, mode: int = 0o644) -> None:
        """Write ``content`` to ``path`` whole."""
        try:
            await self._call(lambda s: s.CopyIn(pb.CopyInRequest(path=path, content=content, mode=mode),
                                                timeout=_CALL_TIMEOUT))
        except grpc.aio.AioRpcError as exc:
            raise OSError(f"writing {path} failed: {exc.code().name}: {exc.details()}") from None

    # --- processes --------------------------------------------------------------------------

    async def launch(self, argv: Sequence[str], *, nonce: str, journal_path: str, stderr_path: str,
                     stdin: bytes | None = None, env: Mapping[str, str] | None = None,
                     secrets: Mapping[str, str] | None = None, interactive: bool = False,
                     home: str = "", workdir: str = "") -> tuple[int, str]:
        """Start ``argv`` under the wrapper (as ``Provider.launch``): ``(pgid, inbox or "")``.

        Not retried once sent (a second launch would start a second agent); it waits for an
        unreachable daemon to come up first.

        Raises:
            SandboxBuildFailed: ``launch``: the daemon refused or failed (detail redacted).
        """
        req = pb.LaunchRequest(argv=list(argv), nonce=nonce, has_stdin=stdin is not None, stdin=stdin or b"",
                               env=dict(env or {}), secrets=dict(secrets or {}), interactive=interactive,
                               journal_path=journal_path, stderr_path=stderr_path, home=home, workdir=workdir)
        try:
            await self.wait_serving(self.patience)
            got = await self._call(lambda s: s.Launch(req, timeout=_CALL_TIMEOUT), retry=False)
        except grpc.aio.AioRpcError as exc:
            raise SandboxBuildFailed("launch", redact(f"{exc.code().name}: {exc.details()}", secrets)) from None
        except (DaemonUnreachable, SandboxGone, PermissionError, ValueError) as exc:
            raise SandboxBuildFailed("launch", redact(str(exc), secrets)) from None
        return int(got.pgid), got.inbox

    async def send_input(self, inbox: str, line: bytes) -> None:
        """Append ``line`` to the inbox (retried: the relay passes each input id once)."""
        try:
            await self._call(lambda s: s.SendInput(pb.SendInputRequest(inbox=inbox, line=line), timeout=_CALL_TIMEOUT))
        except grpc.aio.AioRpcError as exc:
            raise OSError(f"input not delivered: {exc.code().name}: {exc.details()}") from None

    async def kill(self, pgid: int | None, signal: int) -> bool:
        """Signal the process group (``None``: the one the daemon recorded); ``False`` when
        nothing was signalled or the sandbox is gone."""
        try:
            got = await self._call(lambda s: s.Kill(pb.KillRequest(pgid=pgid or 0, signal=signal), timeout=_CALL_TIMEOUT))
        except SandboxGone:
            return False
        return bool(got.signalled)

    async def status(self, pgid: int | None = None) -> pb.StatusResponse:
        """The daemon's status (processes alive, its start time and pid)."""
        return await self._call(lambda s: s.Status(pb.StatusRequest(pgid=pgid or 0), timeout=_CALL_TIMEOUT))

    async def renew_certificate(self, cert: bytes, key: bytes) -> float:
        """Have the daemon serve ``cert`` with ``key`` from its next handshake on
        (``RenewCertificate``); its expiry (Unix seconds). Idempotent: tried again while the
        daemon is unreachable.

        Raises:
            ValueError: the daemon refused the certificate (the reason, no key material).
        """
        got = await self._call(lambda s: s.RenewCertificate(pb.RenewCertificateRequest(cert=cert, key=key),
                                                            timeout=_CALL_TIMEOUT))
        return float(got.not_after)

    async def processes_alive(self, pgid: int | None) -> bool:
        """Whether any of the agent's processes runs (``False`` when the sandbox is gone)."""
        try:
            return bool((await self.status(pgid)).processes_alive)
        except SandboxGone:
            return False

    async def exec(self, argv: Sequence[str], *, timeout: float, workdir: str = "",  # noqa: ASYNC109 -- the command's bound, sent to the daemon
                   env: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None,
                   home: str = "", output_limit: int = 0) -> pb.ExecResponse:
        """Run ``argv`` to its end in the sandbox (``Exec``): its exit code and output's tail.

        Not retried once sent (a setup command may not be idempotent); it waits for an
        unreachable daemon to come up first. Cancelling the call kills the command.

        Raises:
            SandboxBuildFailed: ``exec``: the command did not start, the daemon refused, or it
                stayed unreachable (detail redacted).
        """
        req = pb.ExecRequest(argv=list(argv), workdir=workdir, env=dict(env or {}), secrets=dict(secrets or {}),
                             home=home, timeout_seconds=timeout, output_limit=output_limit)
        try:
            await self.wait_serving(self.patience)
            return await self._call(lambda s: s.Exec(req, timeout=timeout + _CALL_TIMEOUT), retry=False)
        except grpc.aio.AioRpcError as exc:
            raise SandboxBuildFailed("exec", redact(f"{exc.code().name}: {exc.details()}", secrets)) from None
        except (DaemonUnreachable, SandboxGone, PermissionError, ValueError) as exc:
            raise SandboxBuildFailed("exec", redact(str(exc), secrets)) from None

    # --- trees ------------------------------------------------------------------------------

    async def export_tree(self, workdir: str = "", home: str = "") -> bytes:
        """The tar of ``workdir`` (``work/``) and ``home`` (``home/``), as ``Provider.export_tree``.

        Raises:
            FileNotFoundError: the working directory does not exist (``SandboxGone``: nor
                does the sandbox).
            OSError: the tree cannot be read, or the daemon failed.
        """
        async def call(stub: pb_grpc.SandboxDaemonStub) -> bytes:
            buf = io.BytesIO()
            async for chunk in stub.ExportTree(pb.ExportTreeRequest(workdir=workdir, home=home), timeout=300):
                buf.write(chunk.data)
            return buf.getvalue()

        try:
            return await self._call(call)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise FileNotFoundError(exc.details()) from None
            raise OSError(f"export failed: {exc.code().name}: {exc.details()}") from None

    async def import_tree(self, tar: bytes, *, workdir: str = "", home: str = "", replace: bool = False) -> None:
        """Extract an exported tar (as ``Provider.import_tree``).

        Raises:
            SandboxBuildFailed: ``import``: a bad member (nothing written).
        """
        def chunks() -> list[pb.TreeChunk]:
            out = [pb.TreeChunk(data=tar[i:i + _TREE_CHUNK]) for i in range(0, max(len(tar), 1), _TREE_CHUNK)]
            out[0].replace, out[0].workdir, out[0].home = replace, workdir, home
            return out

        try:
            await self._call(lambda s: s.ImportTree(iter(chunks()), timeout=300))
        except ValueError as exc:
            raise SandboxBuildFailed("import", str(exc)) from None
        except grpc.aio.AioRpcError as exc:
            raise OSError(f"import failed: {exc.code().name}: {exc.details()}") from None


__all__ = ["DaemonClient", "DaemonUnreachable", "SandboxGone"]


