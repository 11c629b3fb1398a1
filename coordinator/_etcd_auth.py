"""How the coordinator proves itself to etcd: TLS (client certificates) and user + password.

Settings (coordinators only; docs/deploy.md "TLS"):

- ``BATON_ETCD_CA``: PEM bundle etcd's certificates are checked against. Set (or a
  ``https://`` endpoint, checked against the system's roots), the channel is TLS.
- ``BATON_ETCD_CERT`` / ``BATON_ETCD_KEY``: the client certificate etcd's
  ``--client-cert-auth`` asks for (with etcd's auth on, its common name is the user).
- ``BATON_ETCD_USER`` / ``BATON_ETCD_PASSWORD``: etcd's own auth. The coordinator calls
  ``Authenticate`` for a token and sends it as the ``token`` metadata of every call; a call
  refused ``UNAUTHENTICATED`` (the token expired: simple tokens lapse after etcd's
  ``--auth-token-ttl`` idle, JWTs at their expiry) gets a new token and is sent once more.

The password never reaches a log or an error (the user name does); the token neither.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import grpc
from aetcd import rpc

from baton import tls as _tls
from baton.errors import StoreRefused, StoreUnavailable

log = logging.getLogger(__name__)

CA, CERT, KEY = "BATON_ETCD_CA", "BATON_ETCD_CERT", "BATON_ETCD_KEY"
USER, PASSWORD = "BATON_ETCD_USER", "BATON_ETCD_PASSWORD"


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS and credentials of the coordinator's etcd channel (the default: plaintext, none).

    Attributes:
        tls: dial etcd with TLS.
        ca: PEM bundle etcd is checked against (empty: the system's roots).
        cert, key: the client certificate and key (PEM; empty: none).
        user, password: etcd's auth (empty user: no ``Authenticate``).
    """

    tls: bool = False
    ca: bytes = field(default=b"", repr=False)
    cert: bytes = field(default=b"", repr=False)
    key: bytes = field(default=b"", repr=False)
    user: str = ""
    password: str = field(default="", repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "EtcdSecurity":
        """Read ``BATON_ETCD_CA/CERT/KEY/USER/PASSWORD`` (``https://`` endpoints turn TLS on
        too: :class:`coordinator._etcd.Etcd`).

        Raises:
            baton.tls.TlsConfigError: a file missing, unreadable or mismatched, a user
                without a password (or the reverse); naming the variable.
        """
        env = os.environ if env is None else env
        ca_path = env.get(CA, "").strip()
        ca = _tls.read_pem(CA, ca_path, kind="certificate") if ca_path else b""
        cert, key = _tls.read_pair(CERT, KEY, env)
        user, password = env.get(USER, "").strip(), env.get(PASSWORD, "")
        if bool(user) != bool(password):
            raise _tls.TlsConfigError(f"{PASSWORD if user else USER} must be set with {USER if user else PASSWORD}")
        return cls(bool(ca or cert), ca, cert, key, user, password)

    def channel(self, target: str, options: Sequence[tuple[str, Any]], server_name: str = "") -> Any:
        """A grpc.aio channel to etcd (TLS when set), sending the auth token when a user is set.

        Args:
            server_name: the name etcd's certificates must carry when ``target`` names
                several members (an ``ipv4:`` list has no one host to check).
        """
        if self.tls:
            creds = grpc.ssl_channel_credentials(root_certificates=self.ca or None, private_key=self.key or None,
                                                 certificate_chain=self.cert or None)
            opts = [*options, ("grpc.ssl_target_name_override", server_name)] if server_name else list(options)
            ch = grpc.aio.secure_channel(target, creds, options=opts)
        else:
            ch = grpc.aio.insecure_channel(target, options=list(options))
        return _AuthChannel(ch, _Token(ch, self.user, self.password)) if self.user else ch


def _refused_token(exc: grpc.aio.AioRpcError) -> bool:
    """etcd refused the call's token: expired, revoked, or none sent."""
    return exc.code() == grpc.StatusCode.UNAUTHENTICATED


class _Token:
    """The current etcd auth token: fetched on first need, again after etcd refuses it."""

    def __init__(self, channel: grpc.aio.Channel, user: str, password: str) -> None:
        self._auth = rpc.AuthStub(channel)
        self._user = user
        self._password = password
        self._token = ""
        self._off = False  # etcd's auth is not enabled: no token to send
        self._lock = asyncio.Lock()

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("token", self._token),) if self._token else ()

    def drop(self, used: tuple[tuple[str, str], ...]) -> None:
        """Forget the token a refused call carried (not a newer one another call fetched)."""
        if used == self.metadata():
            self._token = ""

    async def ensure(self, timeout: float | None) -> None:
        """Authenticate unless a token is held.

        Raises:
            StoreUnavailable: etcd did not answer.
            StoreRefused: etcd refused the user or password (``UNAUTHENTICATED``-like
                codes), naming the user, not the password.
        """
        if self._token or self._off:
            return
        async with self._lock:
            if self._token or self._off:
                return
            try:
                resp = await self._auth.Authenticate(rpc.AuthenticateRequest(name=self._user, password=self._password),
                                                     timeout=timeout if timeout is None else max(timeout, 0.001))
            except grpc.aio.AioRpcError as exc:
                details = exc.details() or ""
                if "authentication is not enabled" in details:
                    log.warning("%s is set but etcd's auth is not enabled: calls go without a token", USER)
                    self._off = True
                    return
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise StoreUnavailable(f"etcd authenticate: {exc.code().name.lower()}") from None
                raise StoreRefused(exc.code().name, f"etcd refused to authenticate user {self._user!r} "
                                                    f"({USER}/{PASSWORD}): {details}") from None
            self._token = str(resp.token)


class _AuthUnary:
    """A unary multi-callable that authenticates first, sends the token, and on a refused
    token authenticates again and sends the call once more. Calling it returns a coroutine."""

    def __init__(self, inner: Any, token: _Token) -> None:
        self._inner = inner
        self._token = token

    async def _call(self, request: Any, timeout: float | None = None, **kw: Any) -> Any:
        for attempt in (0, 1):
            await self._token.ensure(timeout)
            md = self._token.metadata()
            try:
                return await self._inner(request, timeout=timeout, metadata=md or None, **kw)
            except grpc.aio.AioRpcError as exc:
                if attempt == 1 or not _refused_token(exc):
                    raise
                self._token.drop(md)
        raise AssertionError("unreachable")

    def __call__(self, request: Any, timeout: float | None = None, **kw: Any) -> Any:
        return self._call(request, timeout, **kw)


class _AuthStream:
    """A stream-stream call opened at its first write or read, once a token is held. A
    refused token is dropped (the caller reopens the stream, which authenticates again)."""

    def __init__(self, open_call: Callable[..., Any], token: _Token) -> None:
        self._open = open_call
        self._token = token
        self._inner: Any = None
        self._md: tuple[tuple[str, str], ...] = ()
        self._cancelled = False

    async def _call(self) -> Any:
        if self._inner is None:
            if self._cancelled:
                raise asyncio.InvalidStateError("the stream was cancelled")
            await self._token.ensure(None)
            self._md = self._token.metadata()
            self._inner = self._open(metadata=self._md or None)
        return self._inner

    async def _do(self, op: str, *args: Any) -> Any:
        call = await self._call()
        try:
            return await getattr(call, op)(*args)
        except grpc.aio.AioRpcError as exc:
            if _refused_token(exc):
                self._token.drop(self._md)
            raise

    async def write(self, message: Any) -> None:
        await self._do("write", message)

    async def read(self) -> Any:
        return await self._do("read")

    async def done_writing(self) -> None:
        await self._do("done_writing")

    def cancel(self) -> bool:
        self._cancelled = True
        return bool(self._inner.cancel()) if self._inner is not None else False


class _AuthChannel:
    """A grpc.aio channel whose calls carry the etcd token (only the kinds etcd's stubs use:
    unary-unary, and stream-stream for keep-alives and watches)."""

    def __init__(self, channel: grpc.aio.Channel, token: _Token) -> None:
        self._channel = channel
        self._token = token

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _AuthUnary(self._channel.unary_unary(*args, **kwargs), self._token)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        inner: Any = self._channel.stream_stream(*args, **kwargs)
        return lambda *a, **kw: _AuthStream(lambda **more: inner(*a, **kw, **more), self._token)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("etcd's stubs used here make no unary-stream calls")

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("etcd's stubs used here make no stream-unary calls")

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)
