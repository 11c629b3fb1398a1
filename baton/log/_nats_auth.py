"""How a service proves itself to NATS: TLS (a CA, a client certificate), a .creds file or an nkey.

Settings (every service; docs/deploy.md "TLS"):

- ``BATON_NATS_CA``: PEM bundle the servers' certificates are checked against (empty: the
  system's roots, when a server asks for TLS).
- ``BATON_NATS_CERT`` / ``BATON_NATS_KEY``: the client certificate a server with
  ``verify: true`` in its ``tls`` block asks for.
- ``BATON_NATS_CREDS``: a ``.creds`` file (a user JWT and its nkey seed: decentralized auth).
- ``BATON_NATS_NKEY_SEED``: a file holding a user's nkey seed (``SU...``: nkey auth).

User and password, or a token, go in ``BATON_NATS_URL`` as before. A client with a CA talks
TLS to a server whose ``tls`` block requires it (nats-py upgrades the connection when the
server's INFO asks). Files are read at each connect; :func:`connect_options` at start-up
stops the process on a missing or unusable one, naming the variable, never a seed.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Mapping

from baton import tls as _tls

CA, CERT, KEY = "BATON_NATS_CA", "BATON_NATS_CERT", "BATON_NATS_KEY"
CREDS, NKEY_SEED = "BATON_NATS_CREDS", "BATON_NATS_NKEY_SEED"


def _read(name: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise _tls.TlsConfigError(f"{name}: cannot read {path}: {exc.strerror or type(exc).__name__}") from None


def connect_options(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``nats.connect`` keyword arguments for ``BATON_NATS_*`` (``{}`` when none is set).

    Returns:
        ``tls`` (an ``ssl.SSLContext``), ``user_credentials`` (a path) or ``nkeys_seed``
        (a path), as set.

    Raises:
        baton.tls.TlsConfigError: a file missing, unreadable or not what it should hold;
            ``BATON_NATS_CREDS`` and ``BATON_NATS_NKEY_SEED`` both set; the ``nkeys``
            package missing for either. Names the variable, never the file's content.
    """
    env = os.environ if env is None else env
    ca, cert, key = (env.get(n, "").strip() for n in (CA, CERT, KEY))
    creds, seed = env.get(CREDS, "").strip(), env.get(NKEY_SEED, "").strip()
    opts: dict[str, Any] = {}
    if ca or cert or key:
        opts["tls"] = _tls.client_ssl_context(ca, cert, key, names=(CA, CERT, KEY))
    if creds and seed:
        raise _tls.TlsConfigError(f"set one of {CREDS} and {NKEY_SEED}, not both")
    if creds:
        data = _read(CREDS, creds)
        if b"BEGIN NATS USER JWT" not in data or b"NKEY SEED" not in data:
            raise _tls.TlsConfigError(f"{CREDS}: {creds} is not a NATS .creds file (a user JWT and its nkey seed)")
        opts["user_credentials"] = creds
    if seed:
        if not _read(NKEY_SEED, seed).strip().startswith(b"SU"):
            raise _tls.TlsConfigError(f"{NKEY_SEED}: {seed} holds no user nkey seed (one line starting SU)")
        opts["nkeys_seed"] = seed
    if creds or seed:
        if importlib.util.find_spec("nkeys") is None:  # nats-py signs the server's nonce with it
            raise _tls.TlsConfigError(f"{CREDS if creds else NKEY_SEED} needs the nkeys package "
                                      "(pip install 'nats-py[nkeys]')")
    return opts
