"""``python -m coordinator`` / ``baton-coordinator``: run one coordinator replica.

Prints ``coordinator listening on <port>`` to stdout once serving (test harnesses wait for
it). SIGTERM/SIGINT shut down gracefully.
"""
from __future__ import annotations

import asyncio
import signal
import sys
from typing import Sequence

from baton import config as baton_config, credentials, gc_tuning, telemetry
from coordinator._config import parse_args
from coordinator._metrics import CoordinatorMetrics
from coordinator._server import CoordinatorServer, build_store
from coordinator._wiring import WiringContext, build_leader_tasks, build_reaper


async def _serve(argv: Sequence[str] | None) -> None:
    cfg = parse_args(argv)
    store = build_store(cfg)
    wiring = WiringContext(cfg, store, CoordinatorMetrics())
    server = CoordinatorServer(cfg, store=store, leader_tasks=build_leader_tasks(wiring),
                               reaper=build_reaper(wiring), metrics=wiring.metrics)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    gc_tuning.freeze_startup()  # what start-up built lives as long as the process
    telemetry.announce("coordinator", f"coordinator listening on {server.port}")
    try:
        await stop.wait()
    finally:
        await server.shutdown()


def main(argv: Sequence[str] | None = None) -> None:
    try:
        telemetry.configure_logging("coordinator")
        loop = baton_config.event_loop()
        gc_tuning.tune_collector()
    except ValueError as exc:
        sys.exit(str(exc))
    try:
        listen = parse_args(argv).listen  # TLS files read and checked here: a bad one names its variable
    except ValueError as exc:
        credentials.refuse("coordinator", exc)
    credentials.exit_if_unsafe("coordinator", listens={"BATON_COORDINATOR_LISTEN": listen},
                               auth_var="BATON_INTERNAL_TOKEN")
    tracing = telemetry.configure_tracing("coordinator")
    try:
        if loop == "uvloop":
            import uvloop

            uvloop.run(_serve(argv))
        else:
            asyncio.run(_serve(argv))
    finally:
        if tracing is not None:
            tracing.shutdown()  # the spans still batched


if __name__ == "__main__":
    main()
