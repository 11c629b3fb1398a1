"""The gateway: the HTTP/SSE edge of baton (docs/design.md §6).

Public surface::

    from gateway import create_app, GatewaySettings
    app = create_app(GatewaySettings.from_env())   # Starlette; run with uvicorn

``python -m gateway`` serves it on ``BATON_GATEWAY_LISTEN``.
"""
from gateway._settings import GatewaySettings
from gateway.app import create_app

__all__ = ["GatewaySettings", "create_app"]
