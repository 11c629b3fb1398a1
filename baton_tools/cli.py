"""The ``baton`` command: a local cluster, the demo, and operator tools.

Commands talk to the gateway over HTTP (``tail``, ``cancel``), to the coordinator over gRPC
(``runs``, ``reap``), or to a sandbox host (``drain``). Addresses come from a flag, else
from ``<data-dir>/cluster.json`` written by ``baton up``, else from the ``BATON_*``
settings.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import time
from typing import Annotated, Any, Optional

import grpc
import httpx
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from baton.internal_auth import sync_channel
from baton.tls import TlsConfigError
from baton.runs import status_name
from baton_tools import host_commands
from baton_tools.cli_support import (_coordinator, _fail, _gateway_url, _http, _info, _internal_token, _unreachable, _when,
                                     console, err)
from baton_tools.cluster import (
    GRPC_OPTIONS,
    ClusterError,
    LocalCluster,
    grpc_serving,
    http_ok,
    pid_alive,
    stop_recorded,
)

DEFAULT_DATA_DIR = host_commands.DEFAULT_DATA_DIR  # BATON_DATA_DIR's default
# Columns the demo prints at when stdout is not a terminal: its table's natural width.
DEMO_LOG_WIDTH = 140

app = typer.Typer(
    name="baton",
    help="Durable AI coding-agent runs that survive disconnects, reloads, deploys and host crashes.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)
health_app = typer.Typer(
    help="Exit 0 when a component is healthy (for container health checks).",
    no_args_is_help=True,
)
app.add_typer(health_app, name="health")


DataDir = Annotated[
    pathlib.Path, typer.Option("--data-dir", "-d", envvar="BATON_DATA_DIR",
                               help="Cluster data directory (holds cluster.json; default: $BATON_DATA_DIR).")
]
UrlOpt = Annotated[
    Optional[str], typer.Option("--url", envvar="BATON_URL", help="Gateway base URL (default: from cluster.json).")
]
ApiKeyOpt = Annotated[
    Optional[str], typer.Option("--api-key", envvar="BATON_API_KEY", help="Bearer API key for the gateway.")
]
CoordOpt = Annotated[
    Optional[str], typer.Option("--coordinator", help="Coordinator gRPC address (default: from cluster.json).")
]


# --- up / down ---------------------------------------------------------------------------


@app.command()
def up(
    hosts: Annotated[int, typer.Option("--hosts", "-n", min=1, help="Number of sandbox hosts.")] = 2,
    data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR),
    port: Annotated[int, typer.Option("--port", "-p", help="Gateway HTTP port on 127.0.0.1 (0 = any free port).")] = 8080,
    replicated: Annotated[bool, typer.Option(
        "--replicated", help="3-member etcd and 3-node NATS JetStream, the delivery log at R3 (BATON_LOG_REPLICAS=3).",
    )] = False,
    etcd_endpoints: Annotated[Optional[str], typer.Option(
        "--etcd-endpoints", help="Use these etcd members (comma-separated host:port) instead of starting etcd.",
    )] = None,
    nats_url: Annotated[Optional[str], typer.Option(
        "--nats-url", help="Use these NATS servers (comma-separated nats://host:port) instead of starting one.",
    )] = None,
) -> None:
    """Start a local cluster in the foreground; Ctrl-C (or `baton down`) stops it.

    Starts etcd and nats-server (data under the data directory), one coordinator, N sandbox
    hosts and one gateway; waits until all are healthy; prints the web page URL and writes
    `DATA_DIR/cluster.json` (pid, address and host id of each component). Every component
    inherits your `BATON_*` environment. Starting again on the same data directory keeps
    the runs (records, delivery logs, transcripts).

    `--replicated` runs the engines as a deployment does (docs/deploy.md): a 3-member etcd
    cluster and a 3-node JetStream cluster on loopback, the delivery log and transcripts
    replicated 3 times. `--etcd-endpoints` / `--nats-url` use servers you run: only the
    coordinator, the hosts and the gateway start here (set `BATON_LOG_REPLICAS` to match
    your JetStream cluster).

    Examples:

        baton up

        baton up --hosts 3 --port 8090 --data-dir /tmp/baton

        baton up --replicated

        BATON_LOG_REPLICAS=3 baton up --etcd-endpoints 10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379 --nats-url nats://10.0.0.1:4222,nats://10.0.0.2:4222,nats://10.0.0.3:4222

        BATON_DETACHED_RUN_TTL=600 baton up
    """
    info = _info(data_dir)
    if info is not None and pid_alive(info.supervisor_pid):
        raise _fail(f"a cluster is already running in {data_dir} (pid {info.supervisor_pid}); `baton down -d {data_dir}`")
    stop = False

    def on_signal(_sig: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    # Handlers before starting, so a Ctrl-C during start-up still stops what was started.
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    if replicated and (etcd_endpoints or nats_url):
        raise _fail("--replicated starts its own engines: give either it or --etcd-endpoints/--nats-url")
    cluster = LocalCluster(data_dir, hosts=hosts, port=port, replicated=replicated,
                           etcd_endpoints=etcd_endpoints, nats_url=nats_url)
    # One line per service as it starts and is ready (a spinner shows nothing in a log).
    cluster.on_step = lambda step: console.print(f"starting {step}…", highlight=False)
    cluster.on_progress = lambda line: console.print(f"  {line}", highlight=False)
    try:
        info = cluster.start()
        table = Table(title=f"baton cluster in {info.data_dir}", show_header=True)
        for col in ("component", "pid", "address", "host id"):
            table.add_column(col)
        for c in info.components:
            table.add_row(c.name, str(c.pid), c.address, c.host_id or "")
        console.print(table)
        console.print(f"gRPC API (baton.v1.Runs): 127.0.0.1:{info.ports['gateway-grpc']}")
        console.print(f"[bold green]ready[/bold green]: open [link={info.url}]{info.url}[/link]  (Ctrl-C to stop)")
        reported: set[str] = set()
        while not stop:
            for name, proc in cluster.procs.items():
                if proc.poll() is not None and name not in reported:
                    reported.add(name)
                    err.print(f"[yellow]{name} exited with {proc.returncode}[/yellow] (log: {data_dir}/logs/{name}.log)")
            time.sleep(0.2)
    except ClusterError as exc:
        raise _fail(str(exc)) from None
    finally:
        cluster.stop()
        for s, h in old.items():
            signal.signal(s, h)
    console.print("stopped")


@app.command()
def down(data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR)) -> None:
    """Stop the cluster that `baton up` started in a data directory.

    Examples:

        baton down

        baton down --data-dir /tmp/baton
    """
    try:
        alive = stop_recorded(data_dir, progress=lambda line: console.print(line, highlight=False))
    except ClusterError as exc:
        raise _fail(str(exc)) from None
    console.print(f"stopped {', '.join(alive)}" if alive else "nothing was running")


# --- demo ----------------------------------------------------------------------------------


@app.command()
def demo(
    quick: Annotated[bool, typer.Option("--quick", help="One journal only (for CI, about 20 s).")] = False,
    hosts: Annotated[int, typer.Option("--hosts", "-n", min=2, help="Sandbox hosts (one is killed).")] = 2,
    data_dir: Annotated[
        Optional[pathlib.Path], typer.Option("--data-dir", "-d", help="Keep the demo cluster's data here (default: a temp dir).")
    ] = None,
) -> None:
    """The main job: a cluster, live runs, a host SIGKILLed mid-run, a table of results.

    Starts a local cluster; starts one replay run per shipped Claude Code journal (plus one
    Codex journal), each with a connected SSE reader; SIGKILLs the host driving most of
    them; disconnects one reader and later rejoins it by `Last-Event-ID`; joins another run
    fresh after a "reload"; lets the surviving host take everything over; then prints one
    row per run. Exit code 0 only when every row has 0 duplicates, 0 gaps, a transcript
    equal to an uninterrupted replay, and status `completed`.

    Examples:

        baton demo

        baton demo --quick
    """
    from baton_tools.demo import run_demo

    if not console.is_terminal and "COLUMNS" not in os.environ:
        # A CI log or a pipe has no width; rich would assume 80 columns, cut the status
        # column and drop the journal column (the row's name). Logs scroll sideways.
        console.width = max(console.width, DEMO_LOG_WIDTH)
    ok = run_demo(console, quick=quick, hosts=hosts, data_dir=data_dir)
    raise typer.Exit(0 if ok else 1)


# --- runs / tail / cancel / reap -------------------------------------------------------------


@app.command()
def runs(
    thread: Annotated[Optional[str], typer.Option("--thread", "-t", help="Only this thread's runs.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many runs.")] = 100,
    as_json: Annotated[bool, typer.Option(
        "--json", help="One run per line, as the HTTP API shows it (GET /api/runs/{runId}; times in ISO 8601).")] = False,
    coordinator: CoordOpt = None,
    data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR),
) -> None:
    """List runs: status, thread, driving host and epoch.

    Examples:

        baton runs

        baton runs --thread my-thread

        baton runs --coordinator 10.0.0.5:7100 --json
    """
    from baton.v1 import coordinator_pb2, coordinator_pb2_grpc

    addr = _coordinator(coordinator, data_dir)
    with sync_channel(addr, GRPC_OPTIONS, _internal_token(data_dir)) as ch:
        try:
            resp = coordinator_pb2_grpc.CoordinatorStub(ch).ListRuns(
                coordinator_pb2.ListRunsRequest(thread_id=thread or "", limit=limit), timeout=10
            )
        except grpc.RpcError as exc:
            raise _unreachable("coordinator", addr, str(exc.details()), data_dir, coordinator) from None
    if as_json:
        for r in resp.records:
            print(json.dumps(host_commands.run_json(r)))
        return
    table = Table(show_header=True)
    for col in ("run", "thread", "status", "agent", "host", "epoch", "started", "detached since"):
        table.add_column(col)
    for r in resp.records:
        table.add_row(
            r.run_id, r.thread_id, status_name(r.status), r.agent.kind or "-", r.driver_host or "-",
            str(r.driver_epoch), _when(r.started_at if r.HasField("started_at") else None),
            _when(r.detached_since if r.HasField("detached_since") else None),
        )
    # Piped (no terminal), rich lays a table out on 80 columns and wraps ids inside their
    # cells; a wide console keeps each run on one line for grep and friends.
    out = console if console.is_terminal else Console(width=1000)
    out.print(table)
    out.print(f"{len(resp.records)} run(s)")


def _describe_chunk(chunk: dict[str, Any]) -> str:
    t = chunk.get("type", "?")
    for key in ("delta", "message", "name", "toolCallName", "content"):
        if key in chunk and isinstance(chunk[key], str):
            text = chunk[key].replace("\n", "\\n")
            return f"{t} {text[:120]}"
    return str(t)


@app.command()
def tail(
    run_id: Annotated[str, typer.Argument(help="The run to read.")],
    offset: Annotated[str, typer.Option("--offset", help="Read after this offset (-1 = from the start, now = only new).")] = "-1",
    as_json: Annotated[bool, typer.Option("--json", help="Print each chunk as a JSON line.")] = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR),
) -> None:
    """Print a run's chunks from an offset until the run's log closes (like the web page).

    Joining a run that lost its host makes the gateway take it over.

    Examples:

        baton tail run-123

        baton tail run-123 --offset 42 --json
    """
    base = _gateway_url(url, data_dir)
    n = 0
    try:
        with _http(api_key, timeout=None) as c, c.stream(
            "GET", f"{base}/api/chat", params={"runId": run_id, "offset": offset},
            headers={"Accept": "application/x-ndjson"},
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise _fail(f"{resp.status_code}: {resp.text.strip()}")
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                item = json.loads(line)
                n += 1
                if as_json:
                    print(json.dumps(item, ensure_ascii=False), flush=True)
                else:
                    # The chunk's text is the agent's: shown as it is (no markup), the id dimmed.
                    line_text = Text(str(item.get("id")), style="dim")
                    line_text.append(" " + _describe_chunk(item.get("chunk", {})))
                    console.print(line_text, highlight=False)
    except httpx.HTTPError as exc:
        raise _unreachable("gateway", base, str(exc), data_dir, url) from None
    except KeyboardInterrupt:
        pass  # detaching is harmless: the run goes on
    if not as_json:
        err.print(f"{n} chunk(s)")


@app.command()
def run(
    prompt: Annotated[Optional[str], typer.Argument(help="What to ask the agent (- or none: read stdin).")] = None,
    repo: Annotated[Optional[str], typer.Option("--repo", help="Git repository: the thread's workspace (first turn).")] = None,
    ref: Annotated[Optional[str], typer.Option("--ref", help="Branch, tag or commit of --repo.")] = None,
    directory: Annotated[Optional[str], typer.Option("--dir", help="A directory inside BATON_WORKSPACE_DIRS instead of --repo.")] = None,
    credential: Annotated[Optional[str], typer.Option("--credential", help="Name of a git credential the operator configured.")] = None,
    setup: Annotated[Optional[list[str]], typer.Option("--setup", help="A command to run in the workspace first (repeatable).")] = None,
    thread: Annotated[Optional[str], typer.Option("--thread", "-t", help="Continue this thread (default: a new one).")] = None,
    agent: Annotated[str, typer.Option("--agent", help="claude-code, codex or replay.")] = "claude-code",
    as_json: Annotated[bool, typer.Option("--json", help="Print each chunk as a JSON line.")] = False,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR),
) -> None:
    """One turn of a coding session: the agent works on the thread's repository.

    The thread's first turn names the repository; its next turns (``--thread``) continue in
    the same workspace and resume the agent's session, on whichever host they land.

    Examples:

        baton run --repo https://github.com/you/app.git --ref main "Fix the failing test"

        baton run --thread cli-1a2b3c "Now add a test for it"
    """
    from baton_tools.run_command import read_prompt, run_turn

    base = _gateway_url(url, data_dir)
    try:
        text = read_prompt(prompt)
        code = run_turn(base, api_key, text, thread=thread, agent=agent, repo=repo, ref=ref, directory=directory,
                        credential=credential, setup=list(setup or []), as_json=as_json)
    except ValueError as exc:
        raise _fail(str(exc), code=2) from None
    except httpx.HTTPError as exc:
        raise _unreachable("gateway", base, str(exc), data_dir, url) from None
    raise typer.Exit(code)


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.")],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Return only when the run is terminal.")] = True,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR),
) -> None:
    """Cancel a run: kill its agent, destroy its sandbox, mark it aborted.

    Examples:

        baton cancel run-123

        baton cancel run-123 --no-wait
    """
    base = _gateway_url(url, data_dir)
    try:
        with _http(api_key, timeout=60.0) as c:
            resp = c.post(f"{base}/api/chat/cancel", params={"wait": "true" if wait else "false"}, json={"runId": run_id})
    except httpx.HTTPError as exc:
        raise _unreachable("gateway", base, str(exc), data_dir, url) from None
    if resp.status_code >= 400:
        raise _fail(f"{resp.status_code}: {resp.text.strip()}")
    console.print_json(resp.text)


@app.command()
def reap(
    ttl: Annotated[float, typer.Option("--ttl", help="Detached-run TTL in seconds (0 = the configured BATON_DETACHED_RUN_TTL).")] = 0.0,
    coordinator: CoordOpt = None,
    data_dir: DataDir = pathlib.Path(DEFAULT_DATA_DIR),
) -> None:
    """One reaper sweep now (for a cron): cancel runs detached longer than the TTL.

    Prints the outcome counts of the sweep.

    Examples:

        baton reap

        baton reap --ttl 600 --coordinator 10.0.0.5:7100
    """
    from baton.v1 import coordinator_pb2, coordinator_pb2_grpc

    addr = _coordinator(coordinator, data_dir)
    with sync_channel(addr, GRPC_OPTIONS, _internal_token(data_dir)) as ch:
        try:
            resp = coordinator_pb2_grpc.CoordinatorStub(ch).Reap(coordinator_pb2.ReapRequest(ttl_seconds=ttl), timeout=120)
        except grpc.RpcError as exc:
            raise _unreachable("coordinator", addr, str(exc.details()), data_dir, coordinator) from None
    table = Table(show_header=True)
    table.add_column("outcome")
    table.add_column("runs", justify="right")
    for k, v in sorted(resp.outcomes.items()):
        table.add_row(k, str(v))
    console.print(table)


# --- operations -------------------------------------------------------------------------------


@health_app.command("grpc")
def health_grpc(
    address: Annotated[str, typer.Argument(help="host:port of a coordinator or sandbox host.")],
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds.")] = 2.0,
) -> None:
    """Exit 0 when `grpc.health.v1.Health/Check` answers SERVING.

    Examples:

        baton health grpc 127.0.0.1:7100
    """
    if not grpc_serving(address, timeout):
        raise _fail(f"{address}: not serving")
    console.print("serving")


@health_app.command("http")
def health_http(
    url: Annotated[str, typer.Argument(help="URL to GET, e.g. the gateway's /readyz.")],
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds.")] = 2.0,
) -> None:
    """Exit 0 when `GET URL` answers 2xx.

    Examples:

        baton health http http://127.0.0.1:8080/readyz
    """
    if not http_ok(url, timeout):
        raise _fail(f"{url}: not ready")
    console.print("ok")


host_commands.register(app)  # `baton hosts`, `drain`, `undrain`


def main() -> None:
    """Console entry point (``python -m baton_tools.cli``)."""
    # gRPC honours proxy variables even for loopback; the CLI only dials what it is told.
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    try:
        app()
    except TlsConfigError as exc:  # a BATON_TLS_* file unusable: the variable, no traceback
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
