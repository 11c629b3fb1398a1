"""The sandbox daemon: runs inside every docker and kubernetes sandbox and is how hosts reach
it; a local sandbox runs one for its setup commands, or for every call with
``BATON_LOCAL_SANDBOX_IO=daemon`` (docs/design.md §5.1).

``python -m sandbox_host.daemon --listen HOST:PORT --root DIR`` serves
``baton.v1.SandboxDaemon`` (protos/baton/v1/sandbox_daemon.proto) and gRPC health. Hosts use
it through :class:`sandbox_host.providers._daemon_client.DaemonClient`.

Credentials: each sandbox's daemon checks its own token, :func:`sandbox_token` of the
cluster's internal token (``BATON_INTERNAL_TOKEN``) and the sandbox key, never the cluster's
token itself: an agent that reads its daemon's environment can reach its own sandbox, which
it is in already, and nothing else. Any host holding the cluster's token derives it.
"""
from __future__ import annotations

import hashlib
import hmac

#: The port a daemon listens on inside a container or pod.
DEFAULT_PORT = 7300
SERVICE_NAME = "baton.v1.SandboxDaemon"
#: Initial metadata key a daemon sends as soon as it takes a follow (``ReadFile`` with
#: ``follow``): a client whose follow then fails knows it had reached the daemon, so the
#: failure starts a fresh patience instead of spending what an earlier outage left.
FOLLOWING = "baton-following"


def sandbox_token(cluster_token: str, key: str) -> str:
    """The token of sandbox ``key``'s daemon: HMAC-SHA256 of the key under the cluster's
    internal token, hex (``""`` without a cluster token: no auth, as every internal link)."""
    if not cluster_token:
        return ""
    return hmac.new(cluster_token.encode(), b"baton-sandbox-daemon:" + key.encode(), hashlib.sha256).hexdigest()


__all__ = ["DEFAULT_PORT", "FOLLOWING", "SERVICE_NAME", "sandbox_token"]
