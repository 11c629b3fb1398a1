"""``python -m sandbox_host.daemon``: the composition root of a sandbox daemon.

Serves ``baton.v1.SandboxDaemon`` and gRPC health (SERVING only once the port is bound) on
``--listen``, refusing calls without ``BATON_INTERNAL_TOKEN`` when it is set (here: the
sandbox's own token, :func:`sandbox_host.daemon.sandbox_token`) and serving TLS with the
internal TLS settings (``BATON_TLS_*``, :mod:`baton.tls`). Once ready it writes
``host:port pid`` to ``--addr-file`` (when given) and prints ``sandbox daemon listening on
<port>``. SIGTERM/SIGINT stop it (exit 0); so does the removal of its state directory (the
sandbox was destroyed). SIGUSR1 writes every thread's stack to stderr. The agents it
launched are in sessions of their own: they outlive it.
"""
from __future__ import annotations

import argparse
import asyncio
import faulthandler
import fcntl
import logging
import os
import signal
import sys
from typing import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from baton import internal_auth, tls
from baton.malloc_tuning import retain_freed_memory
from sandbox_host.daemon import SERVICE_NAME
from sandbox_host.daemon._certs import CertRefused, ServedCert
from sandbox_host.daemon._procs import recorded_pgid, signal_group
from sandbox_host.daemon._service import Activity, SandboxDaemonService, add_to_server

log = logging.getLogger("baton.sandbox_daemon")
_GRPC_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_receive_message_length", 64 << 20),
                 ("grpc.http2.max_frame_size", (1 << 24) - 1)]
#: Seconds between checks that the state directory still exists.
_GONE_CHECK = 1.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(prog="python -m sandbox_host.daemon", description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="HOST:PORT to serve on (PORT 0: any free port)")
    p.add_argument("--root", action="append", required=True,
                   help="a directory the daemon may read and write under (repeatable)")
    p.add_argument("--workdir", default=None, help="relative paths start here (default: the first root)")
    p.add_argument("--state", default=None, help="wrapper, nonces, inboxes (default: <first root>/.baton)")
    p.add_argument("--addr-file", default=None, help="write HOST:PORT here once serving")
    p.add_argument("--lock-file", default=None,
                   help="held locked while the daemon lives; exit 3 at once when another holds it")
    p.add_argument("--idle-exit", type=float, default=0.0,
                   help="stop after this many seconds without a call while no agent process lives (0: never)")
    p.add_argument("--idle-check", type=float, default=0.25,
                   help="seconds a follow waits for an inotify wake-up before it looks anyway")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set or the state directory disappears.

    Raises:
        RuntimeError: the address cannot be bound, or the certificate is unusable.
        baton.tls.TlsConfigError: a ``BATON_TLS_*`` file is unusable.
    """
    service = SandboxDaemonService(args.root, args.workdir, args.state, args.idle_check)
    os.makedirs(service.state_dir, mode=0o700, exist_ok=True)
    server = grpc.aio.server(options=_GRPC_OPTIONS,
                             interceptors=[Activity(service), *internal_auth.server_interceptors()])
    add_to_server(service, server)
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]  # grpc_health stubs lack .aio
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    served = tls.from_env()
    if served.enabled:
        # Renewable in place (RenewCertificate): a certificate minted with a short
        # BATON_SANDBOX_CERT_TTL is replaced before it expires, with no restart.
        try:
            service.certs = ServedCert(served, service.state_dir)
        except CertRefused as exc:
            raise RuntimeError(f"{tls.CERT}: {exc}") from None
        port = server.add_secure_port(args.listen, service.certs.credentials())
    else:
        port = server.add_insecure_port(args.listen)
    if port == 0:
        raise RuntimeError(f"cannot listen on {args.listen}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    host = args.listen.rsplit(":", 1)[0]
    if args.addr_file:
        tmp = f"{args.addr_file}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:  # noqa: ASYNC230 -- a few bytes, once
            f.write(f"{host}:{port} {os.getpid()}\n")
        os.replace(tmp, args.addr_file)
    print(f"sandbox daemon listening on {port}", flush=True)
    try:
        while not stop.is_set():
            try:
                async with asyncio.timeout(_GONE_CHECK):
                    await stop.wait()
            except TimeoutError:
                if not os.path.isdir(service.state_dir):  # noqa: ASYNC240 -- one stat a second
                    log.info("state directory %s is gone: stopping", service.state_dir)
                    break
                if args.idle_exit and service.idle_for() > args.idle_exit and not await asyncio.to_thread(
                        signal_group, recorded_pgid(service.state_dir), 0):
                    log.info("idle for %.0f s with no agent process: stopping", args.idle_exit)
                    break
    finally:
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.stop(grace=1.0)


def _hold_lock(path: str) -> int:
    """Lock ``path`` for the process's life; the descriptor (kept open). Exits 3, saying so on
    stderr, when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"sandbox daemon {os.getpid()}: another daemon holds {path}: exiting", file=sys.stderr, flush=True)
        sys.exit(3)
    log.info("sandbox daemon %d holds its lock; starting", os.getpid())
    return fd


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(args, stop)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Every thread's stack to stderr (the sandbox's daemon.log) on SIGUSR1: what a host that
    # waited in vain for this daemon's address asks for before it gives up.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    args = parse_args(argv)
    retain_freed_memory()  # file reads stream in 1 MiB messages: reuse their buffers
    if args.lock_file:
        _hold_lock(args.lock_file)
    try:
        tls.from_env()
    except tls.TlsConfigError as exc:
        sys.exit(f"sandbox daemon: {exc}")
    try:
        asyncio.run(_main(args))
    except RuntimeError as exc:
        sys.exit(f"sandbox daemon: {exc}")


if __name__ == "__main__":
    main()
