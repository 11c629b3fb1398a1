"""Start-up checks on credentials: no placeholder secret, no open service on the network.

Every service runs :func:`check_start` from its ``main()`` before it connects to anything,
and exits with the message when it fails (:func:`exit_if_unsafe`). Two rules:

- **No placeholder credential.** A value like ``change-me``, ``replace_me``, ``<your-key>``
  or ``xxxx`` in ``BATON_INTERNAL_TOKEN``, a key of ``BATON_API_KEYS``, an agent credential
  (:data:`AGENT_SECRET_NAMES`), ``BATON_ETCD_PASSWORD`` or the user info of a
  ``BATON_NATS_URL`` server is refused:
  a manifest applied as shipped must not run with a key everybody knows.
- **No open service off loopback.** A service whose listen address is not a loopback one
  (``0.0.0.0``, a pod IP, a host name) needs its auth: ``BATON_INTERNAL_TOKEN`` or mutual
  TLS (``BATON_TLS_CLIENT_AUTH=1``: callers without a certificate of the cluster's CA are
  refused in the handshake) for the coordinator and the sandbox hosts, ``BATON_API_KEYS``
  for the gateway (TLS on its public ports encrypts but names no tenant: it is not auth).
  The operator can say otherwise with ``BATON_ALLOW_INSECURE=1`` (a private network, auth
  in front of it). ``baton up`` and the test harness listen on ``127.0.0.1`` and need nothing.

Messages name the variable, never its value (a refusal is logged by the orchestrator).
"""
from __future__ import annotations

import ipaddress
import os
import re
import sys
from typing import Mapping, NoReturn
from urllib.parse import urlsplit

from baton import tls

#: Agent credentials (``required_secrets`` of the agent kinds in :mod:`sandbox_host.agents`):
#: the sandbox hosts hand them to the agents that need them, nothing else reads them.
AGENT_SECRET_NAMES = frozenset({"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "OPENAI_API_KEY", "CODEX_API_KEY"})
ALLOW_INSECURE = "BATON_ALLOW_INSECURE"
INTERNAL_TOKEN = "BATON_INTERNAL_TOKEN"

# What shipped examples and half-edited manifests hold: "change-me", "CHANGEME",
# "change_me_internal", "replace-me", "<api key>", "xxxx", "placeholder". Real tokens are
# random: none of these is a plausible substring of one (checked case-insensitively).
_PLACEHOLDER = re.compile(
    r"change[-_. ]?(me|it)|replace[-_. ]?(me|this)|placeholder|^<.*>$|^x{3,}$|^(todo|fixme|secret|password|token)$",
    re.IGNORECASE)


class UnsafeStart(ValueError):
    """The service's credentials or exposure are unsafe; the message names the variable."""


def is_placeholder(value: str) -> bool:
    """Whether ``value`` is a placeholder rather than a credential (empty is not: it is unset)."""
    return bool(value.strip()) and bool(_PLACEHOLDER.search(value.strip()))


def placeholders(env: Mapping[str, str]) -> list[str]:
    """Where ``env`` holds a placeholder credential: variable names (with the entry), no values."""
    found = []
    if is_placeholder(env.get("BATON_INTERNAL_TOKEN", "")):
        found.append("BATON_INTERNAL_TOKEN")
    for i, pair in enumerate(p.strip() for p in env.get("BATON_API_KEYS", "").split(",")):
        if pair and is_placeholder(pair.partition("=")[0]):
            found.append(f"BATON_API_KEYS (the key of entry #{i + 1})")
    found += sorted(n for n in (*AGENT_SECRET_NAMES, "BATON_ETCD_PASSWORD") if is_placeholder(env.get(n, "")))
    for i, url in enumerate(u.strip() for u in env.get("BATON_NATS_URL", "").split(",")):
        try:
            parts = urlsplit(url if "://" in url else f"nats://{url}")
        except ValueError:
            continue  # not ours to judge here: the NATS client refuses it with its reason
        if any(is_placeholder(v or "") for v in (parts.username, parts.password)):
            found.append(f"BATON_NATS_URL (the credentials of server #{i + 1})")
    return found


def is_loopback(listen: str) -> bool:
    """Whether a ``host:port`` listen address is reachable from this machine only.

    ``0.0.0.0``, ``::`` and an empty host listen on every interface; a host name other than
    ``localhost`` is not resolved and counts as reachable (the safe answer).
    """
    host = listen.rpartition(":")[0] if ":" in listen else listen
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def insecure_allowed(env: Mapping[str, str]) -> bool:
    """``BATON_ALLOW_INSECURE``: the operator serves without auth off loopback on purpose."""
    return env.get(ALLOW_INSECURE, "").strip().lower() in ("1", "true", "yes")


def check_start(service: str, *, listens: Mapping[str, str], auth_var: str,
                env: Mapping[str, str] | None = None) -> None:
    """Refuse placeholder credentials, and serving off loopback without auth.

    Args:
        service: the service's name, for the message (``"coordinator"``).
        listens: setting name → the listen address it resolved to (empty: not served).
        auth_var: the setting that holds the service's auth (``BATON_INTERNAL_TOKEN`` or
            ``BATON_API_KEYS``); empty there means no auth.
        env: the environment (default ``os.environ``).

    Raises:
        UnsafeStart: naming the variables, never their values.
    """
    env = os.environ if env is None else env
    bad = placeholders(env)
    if bad:
        raise UnsafeStart(f"{', '.join(bad)} holds a placeholder, not a credential: set a real secret "
                          "(e.g. `openssl rand -hex 32`) or leave the variable unset")
    if env.get(auth_var, "").strip() or insecure_allowed(env):
        return
    # Mutual TLS authenticates the cluster's callers as the internal token does.
    mtls = auth_var == INTERNAL_TOKEN
    if mtls and tls.mtls_required(env):
        return
    exposed = {name: addr for name, addr in listens.items() if addr and not is_loopback(addr)}
    if exposed:
        where = ", ".join(f"{name}={addr}" for name, addr in exposed.items())
        alt = f" and {tls.CLIENT_AUTH} is off" if mtls else ""
        fix = f"set {auth_var}" + (f" or {tls.CLIENT_AUTH}=1 (mutual TLS)" if mtls else "")
        raise UnsafeStart(
            f"the {service} would serve without auth on a non-loopback address ({where}) while {auth_var} "
            f"is empty{alt}: {fix}, listen on 127.0.0.1, or set {ALLOW_INSECURE}=1 to serve without auth anyway")


def exit_if_unsafe(service: str, *, listens: Mapping[str, str], auth_var: str) -> None:
    """:func:`check_start` for a ``main()``: exit with status 2 and the message on stderr.

    Raises:
        SystemExit: when the check fails.
    """
    try:
        check_start(service, listens=listens, auth_var=auth_var)
    except UnsafeStart as exc:
        refuse(service, exc)


def check_files(*, nats: bool, env: Mapping[str, str] | None = None) -> None:
    """Read every TLS and credential file the service's settings name, as it will when it
    connects: the internal links' (``BATON_TLS_*``) and, with ``nats``, NATS's
    (``BATON_NATS_*``). For a ``main()``, before anything connects.

    Raises:
        baton.tls.TlsConfigError: (a ``ValueError``) naming the variable and the path.
    """
    tls.from_env(env)
    if nats:
        from baton.log._nats_auth import connect_options

        connect_options(env)


def refuse(service: str, reason: object) -> NoReturn:
    """Exit the process with status 2 and ``baton-<service>: refusing to start: <reason>``."""
    print(f"baton-{service.replace(' ', '-')}: refusing to start: {reason}", file=sys.stderr, flush=True)
    sys.exit(2)
