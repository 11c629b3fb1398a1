"""``baton hosts``, ``baton drain``, ``baton undrain``: the sandbox hosts as an operator sees them.

:func:`register` adds them to the CLI's app (``baton_tools.cli`` calls it: that module may
run as ``__main__``, so this one never imports it). Every command
finds the cluster as the others do (a flag, else ``<data-dir>/cluster.json``, else the
``BATON_*`` settings) and carries the cluster's internal token (``BATON_INTERNAL_TOKEN``, else
the one ``baton up`` keeps in the data directory), so nothing needs exporting by hand.
"""
from __future__ import annotations

import json
import pathlib
from datetime import datetime, timezone
from typing import Annotated, Any, Optional

import grpc
import typer
from rich.console import Console
from rich.table import Table

from baton import config
from baton.internal_auth import sync_channel
from baton.runs import status_name
from baton.v1 import coordinator_pb2, coordinator_pb2_grpc, runs_pb2, sandbox_host_pb2, sandbox_host_pb2_grpc
from baton_tools.cli_support import _coordinator, _fail, _internal_token, _unreachable, console
from baton_tools.cluster import GRPC_OPTIONS

#: Most recent runs ``baton hosts`` looks at to find dead hosts' runs (as the operator page).
RECENT_RUNS = 500

DEFAULT_DATA_DIR = config.get("BATON_DATA_DIR", {})
DataDir = Annotated[
    pathlib.Path, typer.Option("--data-dir", "-d", envvar="BATON_DATA_DIR",
                               help="Cluster data directory (holds cluster.json; default: $BATON_DATA_DIR).")
]
CoordOpt = Annotated[
    Optional[str], typer.Option("--coordinator", help="Coordinator gRPC address (default: from cluster.json).")
]
HostArg = Annotated[str, typer.Argument(help="The sandbox host: its id (as `baton hosts` lists it) or gRPC address.")]


def _iso(value: Any) -> Any:
    return datetime.fromtimestamp(value, timezone.utc).isoformat() if isinstance(value, (int, float)) else value


def _iso_times(value: Any) -> Any:
    """``value`` with every time field (``…At``, ``…Since``: Unix seconds) as ISO 8601 UTC."""
    if isinstance(value, dict):
        return {k: _iso(v) if (k.endswith("At") or k.endswith("Since")) and not isinstance(v, bool)
                else _iso_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_iso_times(v) for v in value]
    return value


def run_json(record: runs_pb2.RunRecord, claim: Any | None = None) -> dict[str, Any]:
    """A run as the HTTP API shows it (``GET /api/runs/{runId}``), times in ISO 8601 UTC."""
    from gateway._views import record_json

    return _iso_times(record_json(record, claim))  # type: ignore[no-any-return]


def _stub(ch: grpc.Channel) -> coordinator_pb2_grpc.CoordinatorStub:
    return coordinator_pb2_grpc.CoordinatorStub(ch)


def host_rows(addr: str, token: str | None) -> list[dict[str, Any]]:
    """Registered hosts, then dead ones: hosts whose session is gone that still had runs.

    A dead host is the last driver of a running run that holds no claim and is no longer
    registered (among the newest :data:`RECENT_RUNS` runs), until those runs moved.

    Raises:
        grpc.RpcError: the coordinator did not answer.
    """
    with sync_channel(addr, GRPC_OPTIONS, token) as ch:
        hosts = _stub(ch).ListHosts(coordinator_pb2.ListHostsRequest(), timeout=10).hosts
        live_ids = {h.host_id for h in hosts}
        recs = _stub(ch).ListRuns(coordinator_pb2.ListRunsRequest(limit=RECENT_RUNS), timeout=10).records
        dead: dict[str, list[str]] = {}
        for r in recs:
            if status_name(r.status) != "running" or not r.driver_host or r.driver_host in live_ids or r.starting:
                continue
            view = _stub(ch).GetRun(coordinator_pb2.GetRunRequest(run_id=r.run_id), timeout=10)
            if not view.HasField("claim"):
                dead.setdefault(r.driver_host, []).append(r.run_id)
    rows = [{"hostId": h.host_id, "address": h.address, "load": h.load, "capacity": h.capacity,
             "draining": h.draining, "state": "live", "runs": []} for h in sorted(hosts, key=lambda h: h.host_id)]
    rows += [{"hostId": host, "address": None, "load": len(runs), "capacity": None, "draining": False,
              "state": "dead", "runs": sorted(runs)} for host, runs in sorted(dead.items())]
    return rows


def hosts(
    as_json: Annotated[bool, typer.Option("--json", help="One host per line as JSON.")] = False,
    coordinator: CoordOpt = None,
    data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR),
) -> None:
    """List the sandbox hosts: id, address, load / capacity, draining, live or dead.

    A dead host is one whose session is gone while it still had runs; it is listed, with
    the runs it left, until they have moved to another host.

    Examples:

        baton hosts

        BATON_DATA_DIR=/tmp/baton baton hosts --json
    """
    addr = _coordinator(coordinator, data_dir)
    try:
        rows = host_rows(addr, _internal_token(data_dir))
    except grpc.RpcError as exc:
        raise _unreachable("coordinator", addr, str(exc.details()), data_dir, coordinator) from None
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    table = Table(show_header=True)
    for col in ("host", "address", "load / capacity", "draining", "state", "runs not moved"):
        table.add_column(col)
    for h in rows:
        load = f"{h['load']} / {h['capacity'] or 'no limit'}" if h["state"] == "live" else "-"
        state = "[red]dead[/red]" if h["state"] == "dead" else "[green]live[/green]"
        table.add_row(h["hostId"], h["address"] or "-", load, "yes" if h["draining"] else "no", state,
                      " ".join(h["runs"]) or "-")
    out = console if console.is_terminal else Console(width=1000)
    out.print(table)
    dead = sum(h["state"] == "dead" for h in rows)
    out.print(f"{len(rows) - dead} live host(s), {dead} dead")


def _host_address(host: str, coordinator: str | None, data_dir: pathlib.Path, token: str | None) -> str:
    """``host`` as a gRPC address: itself when it has a port, else the registered host's."""
    if ":" in host:
        return host
    addr = _coordinator(coordinator, data_dir)
    try:
        with sync_channel(addr, GRPC_OPTIONS, token) as ch:
            listed = _stub(ch).ListHosts(coordinator_pb2.ListHostsRequest(), timeout=10).hosts
    except grpc.RpcError as exc:
        raise _unreachable("coordinator", addr, str(exc.details()), data_dir, coordinator) from None
    for h in listed:
        if h.host_id == host:
            return str(h.address)
    known = ", ".join(sorted(h.host_id for h in listed)) or "none"
    raise _fail(f"no live host {host!r} (live hosts: {known})")


def drain(
    host: HostArg,
    timeout: Annotated[float, typer.Option("--timeout", help="Give up after this many seconds.")] = 40.0,
    coordinator: CoordOpt = None,
    data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR),
) -> None:
    """Drain a sandbox host: stop taking work and hand every run it drives to another host.

    Prints how many runs another host holds now. Used as the Kubernetes `preStop` hook; the
    host then exits on SIGTERM. `baton undrain` makes it take work again.

    Examples:

        baton drain host-1

        baton drain 10.0.0.7:7200 --timeout 30
    """
    token = _internal_token(data_dir)
    address = _host_address(host, coordinator, data_dir, token)
    with sync_channel(address, GRPC_OPTIONS, token) as ch:
        try:
            resp = sandbox_host_pb2_grpc.SandboxHostStub(ch).Drain(sandbox_host_pb2.DrainRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            raise _fail(f"host {address}: {exc.details()}") from None
    console.print(f"handed over {resp.handed_over} run(s)")


def undrain(
    host: HostArg,
    coordinator: CoordOpt = None,
    data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR),
) -> None:
    """Make a drained sandbox host take work again (new runs and takeovers).

    Examples:

        baton undrain host-1

        baton undrain 10.0.0.7:7200
    """
    token = _internal_token(data_dir)
    address = _host_address(host, coordinator, data_dir, token)
    with sync_channel(address, GRPC_OPTIONS, token) as ch:
        try:
            resp = sandbox_host_pb2_grpc.SandboxHostStub(ch).Undrain(sandbox_host_pb2.UndrainRequest(), timeout=20)
        except grpc.RpcError as exc:
            raise _fail(f"host {address}: {exc.details()}") from None
    console.print("taking work again" if resp.was_draining else "was not draining: nothing to do")


def register(app: typer.Typer) -> None:
    """Add ``hosts``, ``drain`` and ``undrain`` to ``app``."""
    for command in (hosts, drain, undrain):
        app.command()(command)
