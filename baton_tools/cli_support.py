"""Helpers every ``baton`` command shares: finding the cluster (a flag, else
``<data-dir>/cluster.json``, else the ``BATON_*`` settings), its internal token, errors.

Its own module so that the command modules (:mod:`baton_tools.cli`,
:mod:`baton_tools.host_commands`) import it rather than each other.
"""
from __future__ import annotations

import os
import pathlib
import ssl
from datetime import datetime, timezone

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from baton import config
from baton_tools.cluster import INTERNAL_TOKEN_FILE, ClusterError, ClusterInfo

console = Console()
err = Console(stderr=True)


def _info(data_dir: pathlib.Path) -> ClusterInfo | None:
    try:
        info = ClusterInfo.load(data_dir)
    except (ClusterError, ValueError, TypeError):
        return None
    return info if info.components else None


def _gateway_url(url: str | None, data_dir: pathlib.Path) -> str:
    if url:
        return url.rstrip("/")
    info = _info(data_dir)
    if info is not None:
        return info.url
    host, _, port = config.get("BATON_GATEWAY_LISTEN").rpartition(":")
    return f"http://{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{port}"


def _internal_token(data_dir: pathlib.Path) -> str | None:
    """``BATON_INTERNAL_TOKEN``, else the token `baton up` keeps in the data directory."""
    if config.get("BATON_INTERNAL_TOKEN"):
        return None  # sync_channel reads it from the environment
    try:
        return (data_dir / INTERNAL_TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def _coordinator(addr: str | None, data_dir: pathlib.Path) -> str:
    if addr:
        return addr
    info = _info(data_dir)
    if info is not None:
        return info.coordinator
    return config.get("BATON_COORDINATOR").split(",")[0]


def _unreachable(what: str, address: str, detail: str, data_dir: pathlib.Path, given: str | None) -> typer.Exit:
    """The error for a component that did not answer; says so when the address was only the
    default because no cluster runs in ``data_dir`` (after ``baton down``, or none yet)."""
    hint = ""
    if given is None and _info(data_dir) is None:
        hint = f" (no cluster running in {data_dir}: start one with `baton up`, or give the address)"
    return _fail(f"{what} {address}: {detail}{hint}")


def _http(api_key: str | None, timeout: float | None = 10.0) -> httpx.Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # No proxy variables (trust_env), but an HTTPS gateway's CA may be named the usual way.
    ca = os.environ.get("SSL_CERT_FILE")
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if ca else True
    return httpx.Client(trust_env=False, timeout=timeout, headers=headers, verify=verify)


def _fail(message: str, code: int = 1) -> typer.Exit:
    if message.startswith("401:"):
        message += " (give the gateway's API key with --api-key or BATON_API_KEY)"
    # Escaped: a message holding brackets (``baton[tools]``, a path) is not rich markup.
    err.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
