"""``python -m gateway``: serve the gateway with uvicorn on ``BATON_GATEWAY_LISTEN``.

Every setting comes from ``BATON_*`` variables (``python -m baton.config`` lists them).
SIGTERM stops accepting, ends open streams (readers then unregister their presence, so
runs detach rather than stop) and closes the gateway session.
"""
from __future__ import annotations

import argparse
import logging

import uvicorn

from baton import config
from gateway._settings import GatewaySettings
from gateway.app import create_app


def main(argv: list[str] | None = None) -> None:
    """Parse flags (defaults from the environment) and serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default=config.get("BATON_GATEWAY_LISTEN"),
                        help="host:port to listen on (BATON_GATEWAY_LISTEN)")
    parser.add_argument("--log-level", default=config.get("BATON_LOG_LEVEL"))
    args = parser.parse_args(argv)
    level = args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.listen.rpartition(":")
    app = create_app(GatewaySettings.from_env())
    uvicorn.run(
        app,
        host=host or "0.0.0.0",
        port=int(port),
        log_level=level.lower(),
        access_log=False,
        # Streams end quickly on shutdown: readers see the disconnect and unregister.
        timeout_graceful_shutdown=5,
        lifespan="on",
    )


if __name__ == "__main__":
    main()
