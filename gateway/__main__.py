"""``python -m gateway``: serve the gateway with uvicorn on ``BATON_GATEWAY_LISTEN``.

Every setting comes from ``BATON_*`` variables (``python -m baton.config`` lists them).
SIGTERM stops accepting, ends open streams (readers then unregister their presence, so
runs detach rather than stop) and closes the gateway session. With
``BATON_GATEWAY_WORKERS`` > 1 this process supervises that many workers on the same ports
(gateway/_supervisor.py); each is this same command with ``--worker i/N``.
"""
from __future__ import annotations

import argparse
import dataclasses
import asyncio
import logging
import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn

from baton import config, credentials, gc_tuning, telemetry
from gateway._connection import uvicorn_options
from gateway._settings import PUBLIC_CERT, PUBLIC_KEY, GatewaySettings
from gateway.app import create_app


log = logging.getLogger("gateway")


class _Server(uvicorn.Server):
    """uvicorn's server, except that SIGTERM/SIGINT also end a startup that is still waiting
    (NATS or the coordinator unreachable). uvicorn only checks for a signal once the app has
    started, so the process would ignore it until SIGKILL; a gateway still starting serves no
    reader, so there is nothing to end gracefully: the process then ends by that signal, as
    uvicorn ends one it stopped on a signal."""

    _serving: asyncio.Task[None] | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _signal: int | None = None
    #: A worker's own probe socket (listening), answered once the app has started.
    probe: socket.socket | None = None
    _probe_server: asyncio.base_events.Server | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop, self._serving = asyncio.get_running_loop(), asyncio.current_task()
        log.info("event loop: %s.%s", type(self._loop).__module__, type(self._loop).__qualname__)
        try:
            await super().serve(sockets)
        except asyncio.CancelledError:
            if self.started or not self.should_exit or self._signal is None:
                raise
            log.info("stopped while starting")
            # uvicorn's signal handlers are gone by now (its context manager restored the
            # previous ones): the default action ends the process.
            signal.raise_signal(self._signal)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.probe is not None and self.started:
            self._probe_server = await asyncio.get_running_loop().create_server(_Hangup, sock=self.probe)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._probe_server is not None:
            self._probe_server.close()  # refused from now on: the coordinator's probe says "gone"
        # Open streams would hold the graceful shutdown until its timeout, then be cancelled
        # (an ERROR traceback each): no new connections, then end them, then uvicorn's shutdown.
        for server in self.servers:
            server.close()
        state = getattr(getattr(self.config.app, "state", None), "gateway", None)
        if state is not None:
            log.info("shutting down: ending %d open stream(s); their readers reconnect", state.streams.close_all())
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._signal = sig
        if not self.started and self._serving is not None and self._loop is not None:
            # A signal handler: hand the cancel to the loop.
            self._loop.call_soon_threadsafe(self._serving.cancel)


class _Hangup(asyncio.Protocol):
    """The probe port of a worker: accept, then close (the coordinator's probe only connects)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def _probe_socket(host: str) -> socket.socket:
    """A worker's probe port: any free port on ``host``, listening now (a connect succeeds
    while the worker lives and is refused once it is gone; workers share the HTTP port, so
    a connect there would not tell them apart)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.bind(addr)
    sock.listen(64)
    sock.setblocking(False)
    return sock


def _supervise(settings: GatewaySettings, listen: str, level: str) -> None:
    """Serve with ``settings.workers`` worker processes until SIGTERM/SIGINT."""
    import os

    from gateway._supervisor import Supervisor, reserve_port, worker_command
    from gateway._workers import metrics_listen

    try:
        http_listen, http_hold = reserve_port(listen)
        grpc_listen, grpc_hold = reserve_port(settings.grpc_listen)
    except (OSError, ValueError) as exc:
        sys.exit(f"cannot bind the gateway's ports for its workers: {exc}")
    log.info("gateway: %d workers on %s (gRPC %s)", settings.workers, http_listen, grpc_listen or "off")
    base_env = dict(os.environ)

    def env(i: int) -> dict[str, str]:
        return {**base_env, "BATON_GATEWAY_GRPC_LISTEN": grpc_listen,
                "BATON_GATEWAY_METRICS_LISTEN": metrics_listen(settings.metrics_listen, i)}

    try:
        code = Supervisor(settings.workers, lambda i: worker_command(i, settings.workers, http_listen, level),
                          env).run()
    finally:
        for hold in (http_hold, grpc_hold):
            if hold is not None:
                hold.close()
    sys.exit(code)


def _worker_of(raw: str | None) -> tuple[int, int] | None:
    if raw is None:
        return None
    i, _, n = raw.partition("/")
    if not (i.isdigit() and n.isdigit() and int(i) < int(n)):
        sys.exit(f"--worker must be i/N with 0 <= i < N, not {raw!r}")
    return int(i), int(n)


def _https(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn's ``ssl_certfile``/``ssl_keyfile`` from ``BATON_GATEWAY_TLS_CERT``/``_KEY``
    (checked by :meth:`GatewaySettings.from_env`); none without them."""
    if not settings.public_tls.enabled:
        return {}
    return {"ssl_certfile": config.get(PUBLIC_CERT), "ssl_keyfile": config.get(PUBLIC_KEY)}


def main(argv: list[str] | None = None) -> None:
    """Parse flags (defaults from the environment) and serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default=config.get("BATON_GATEWAY_LISTEN"),
                        help="host:port to listen on (BATON_GATEWAY_LISTEN)")
    parser.add_argument("--log-level", default=config.get("BATON_LOG_LEVEL"))
    parser.add_argument("--worker", default=None, metavar="I/N",
                        help="serve as worker I of N beside the others on the same ports (set by the "
                             "supervisor that BATON_GATEWAY_WORKERS > 1 starts)")
    args = parser.parse_args(argv)
    worker = _worker_of(args.worker)
    try:
        loop = config.event_loop()
        gc_tuning.tune_collector()
    except ValueError as exc:
        sys.exit(str(exc))
    level = args.log_level.upper()
    try:
        telemetry.configure_logging("gateway", level=level)
    except ValueError as exc:
        sys.exit(str(exc))
    tracing = telemetry.configure_tracing("gateway")
    host, _, port = args.listen.rpartition(":")
    try:
        settings = GatewaySettings.from_env()  # TLS files read and checked: a bad one names its variable
        credentials.check_files(nats=True)
    except ValueError as exc:
        credentials.refuse("gateway", exc)
    credentials.exit_if_unsafe("gateway", auth_var="BATON_API_KEYS", listens={
        "BATON_GATEWAY_LISTEN": args.listen, "BATON_GATEWAY_GRPC_LISTEN": settings.grpc_listen})
    if worker is None and settings.workers > 1:
        _supervise(settings, args.listen, level)
    sockets: list[socket.socket] | None = None
    probe: socket.socket | None = None
    if worker is not None:
        from gateway._supervisor import shared_socket
        from gateway._workers import worker_settings

        settings = worker_settings(settings, worker[1])
        try:
            sockets = [shared_socket(args.listen)]
            if not settings.probe_address:
                probe = _probe_socket(host.strip("[]") or "0.0.0.0")
        except OSError as exc:
            sys.exit(f"gateway worker {args.worker}: cannot bind {args.listen}: {exc}")
        if probe is not None:
            probe_host = socket.gethostname() if host in ("", "0.0.0.0", "::", "[::]") else host
            settings = dataclasses.replace(settings, probe_address=f"{probe_host}:{probe.getsockname()[1]}")
    if not settings.probe_address:
        # The coordinator probes this address when the gateway's keep-alive stream breaks.
        probe_host = socket.gethostname() if host in ("", "0.0.0.0", "::", "[::]") else host
        settings = dataclasses.replace(settings, probe_address=f"{probe_host}:{port}")
    app = create_app(settings)
    server = _Server(uvicorn.Config(
        app,
        host=host or "0.0.0.0",
        port=int(port),
        log_level=level.lower(),
        log_config=None,  # uvicorn's loggers propagate to the one handler (BATON_LOG_FORMAT)
        access_log=False,
        server_header=False,  # no "server: uvicorn" on every answer: it says nothing a client needs
        # Streams end quickly on shutdown: readers see the disconnect and unregister.
        timeout_graceful_shutdown=5,
        lifespan="on",
        # Named, never uvicorn's "auto": the loop is a setting, and tests run under both.
        loop=loop,
        # Head and body timeouts, per-client connection cap (BATON_HTTP_*).
        **uvicorn_options(settings.connections),
        # HTTPS when the public certificate is set (the gRPC port then serves TLS too).
        **_https(settings),
    ))
    server.probe = probe
    try:
        server.run(sockets)
    except KeyboardInterrupt:  # SIGINT re-raised by uvicorn once it stopped
        pass
    finally:
        if tracing is not None:
            tracing.shutdown()  # the spans still batched
    if not server.started:
        sys.exit(3)  # the app failed to start (what uvicorn.run exits with)


if __name__ == "__main__":
    main()
