"""baton: durable AI coding-agent runs with takeover.

The shared package: generated stubs (:mod:`baton.v1`), errors, ids, configuration, the
delivery-log client and the AG-UI glue used by more than one service.
"""

__version__ = "0.1.0"
