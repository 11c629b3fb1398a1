"""``python -m coordinator`` / ``baton-coordinator``: run one coordinator replica.

Prints ``coordinator listening on <port>`` to stdout once serving (test harnesses wait for
it). SIGTERM/SIGINT shut down gracefully.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Sequence

from baton import config as baton_config
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
    print(f"coordinator listening on {server.port}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.shutdown()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=baton_config.get("BATON_LOG_LEVEL").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        loop = baton_config.event_loop()
    except ValueError as exc:
        sys.exit(str(exc))
    if loop == "uvloop":
        import uvloop

        uvloop.run(_serve(argv))
    else:
        asyncio.run(_serve(argv))


if __name__ == "__main__":
    main()
