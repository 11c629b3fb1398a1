"""baton as a Durable Streams server (docs/design.md §6.4): the protocol under ``/ds``.

``/ds/<path>`` is any stream a client creates (kept in the ``BATON_DS`` JetStream stream);
``/ds/runs/<runId>`` is a run's delivery log, read-only. Bearer keys and tenants are the
gateway's: with keys configured, a tenant's stream paths are its own namespace.
"""
from __future__ import annotations

from gateway.durable_streams._app import PREFIX, DurableStreams, build_app, of, start_for
from gateway.durable_streams._routes import DSSettings
from gateway.durable_streams._store import StoreConfig, StreamStore

__all__ = ["PREFIX", "DSSettings", "DurableStreams", "StoreConfig", "StreamStore", "build_app", "of", "start_for"]
