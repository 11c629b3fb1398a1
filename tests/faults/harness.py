"""The fault suite's machinery: a whole cluster of real processes, readers, and the checks.

A :class:`FaultCluster` is etcd, nats-server, one coordinator, N sandbox hosts and one
gateway, each a real process of its own with its own data directory (a fault may kill,
stop or restart any of them), plus an optional :class:`~baton_tools.testing.proxy.TcpProxy`
between the coordinator and etcd for network blips.

Runs are started through ``POST /api/chat`` with the replay agent (agent kind ``replay``)
playing a corpus journal at a speed; each run has a :class:`~tests.faults.readers.Reader`
(an SSE tab that reconnects with ``Last-Event-ID``, as the TanStack client does) or is
*detached* (its reader leaves after the first chunks; only a fresh read at the end sees
the rest).

:meth:`FaultCluster.check` compares every run with the uninterrupted replay of its journal
(:mod:`baton_tools.reference`): each reader's chunks, a fresh full read, the raw stored log
(no record of a lower epoch after a higher fence, no duplicate message id, exactly one close
and it is last), the saved transcript, the final status, and that no sandbox directory or
agent process is left behind.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Sequence

import httpx

from baton.fingerprint import fingerprint
from baton.log import DeliveryLog, LogConfig
from baton.runs import RUN_ACCEPTED, is_host_chunk
from baton.transcript import build_transcript
from baton_tools.reference import expected_status, reference_chunks, speed_for
from baton_tools.testing.cluster import CoordinatorProcess, GatewayProcess, HostProcess, start_coordinator, \
    start_gateway, start_host, start_together
from baton_tools.testing.proxy import TcpProxy
from baton_tools.testing.replicated import EtcdCluster, NatsCluster
from baton_tools.testing.servers import EtcdServer, NatsServer
from tests.faults.readers import READ_TIMEOUT, Reader

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = REPO / "corpus"
#: Claude with partial messages, bash denied: 122 lines, ~340 chunks. The default journal.
LONG = "claude-stream-json/partial-messages-bash-exit-128.jsonl"
#: Claude with sub-agents and parallel tools: 47 lines.
SHORT = "claude-stream-json/subagents-parallel-tools-v2.0.25.jsonl"
#: Codex with commands and a file change: 11 lines.
CODEX = "codex-exec-json/zsh-commands-and-file-change.jsonl"
TERMINAL = frozenset({"completed", "failed", "cancelled", "interrupted", "aborted"})
#: Session TTL of every component (s). The product's default (2 s) loses sessions on a
#: machine whose 2 cores run several suites at once, before any fault: a case would then
#: test that instead of its own fault. Cases that need sessions lost fault for longer.
SESSION_TTL = 5.0


def _format_of(journal: str) -> str:
    return pathlib.PurePath(journal).parts[0]


# --- runs ------------------------------------------------------------------------------------------


@dataclass
class FaultRun:
    """One run of a scenario and what the uninterrupted replay says it must deliver."""

    run_id: str
    thread_id: str
    journal: str
    speed: float
    messages: list[dict[str, Any]]
    reference: list[dict[str, Any]]
    detached: bool = False
    reader: "Reader | None" = None
    #: Refusals of the start POST that this run's scenario expects (the start is retried).
    start_refusals: list[tuple[int, str]] = field(default_factory=list)

    @property
    def body(self) -> dict[str, Any]:
        """The ``POST /api/chat`` body (AG-UI run input plus the agent)."""
        return {"threadId": self.thread_id, "runId": self.run_id, "messages": self.messages,
                "agent": {"kind": "replay", "journal": self.journal, "speed": self.speed}}

    @property
    def expected_status(self) -> str:
        return expected_status(self.reference)

    @property
    def transcript(self) -> list[dict[str, Any]]:
        return build_transcript(self.reference, input_messages=self.messages)


# --- the cluster ------------------------------------------------------------------------------


@dataclass
class _NatsWithStore(NatsServer):
    """A nats-server whose JetStream store lives in ``store`` (its log does not)."""

    store: pathlib.Path = pathlib.Path()

    def _argv(self) -> list[str]:
        argv = super()._argv()
        argv[argv.index("-sd") + 1] = str(self.store)
        return argv


@dataclass
class StoredLog:
    """A run's raw log: every record's headers, and the chunk bodies by offset."""

    records: list[Any]
    origin: dict[str, str]   # offset → journal | host, chunks only


class FaultCluster:
    """etcd, nats-server, a coordinator, N hosts and a gateway as processes of their own.

    Build with :meth:`start`; the ``fault_cluster`` fixture closes it. Attributes are the
    process handles a test injects faults into: ``etcd`` / ``nats`` (``.kill()``,
    ``.start()``, ``.proc`` for signals), ``coordinator``, ``hosts``, ``gateway`` and
    ``etcd_proxy`` (``None`` unless asked for).
    """

    def __init__(self, tmp: pathlib.Path, name: str) -> None:
        self.tmp = tmp
        self.name = name
        self.tag = uuid.uuid4().hex[:8]
        self.etcd = EtcdServer(tmp / "etcd")
        self.nats: NatsServer = NatsServer(tmp / "nats")
        self.etcd_proxy: TcpProxy | None = None
        self.coordinator: CoordinatorProcess | None = None
        self.hosts: list[HostProcess] = []
        self.gateway: GatewayProcess | None = None
        self.http = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(10.0, read=READ_TIMEOUT))
        self.runs: list[FaultRun] = []
        self.env: dict[str, str] = {}
        self.fault_started: float | None = None
        self.fault_ended: float | None = None
        self.recovery: float | None = None
        self.notes: list[str] = []

    # lifecycle

    async def start(self, *, hosts: int = 3, etcd_proxy: bool = False, session_ttl: float = SESSION_TTL,
                    nats_store: pathlib.Path | None = None, replicated: bool = False,
                    coordinator_env: dict[str, Any] | None = None, host_env: dict[str, Any] | None = None,
                    gateway_env: dict[str, Any] | None = None) -> "FaultCluster":
        """Start every process; returns once the gateway is ready and every host serves.

        Args:
            hosts: sandbox hosts to start.
            etcd_proxy: the coordinator reaches etcd through :attr:`etcd_proxy`.
            session_ttl: ``BATON_SESSION_TTL`` of the coordinator, hosts and gateway (s).
            nats_store: JetStream's store directory (e.g. a small tmpfs); its log stays out.
            replicated: 3-node etcd and 3-node JetStream cluster (streams R3) instead of one
                of each (:mod:`baton_tools.testing.replicated`).
            coordinator_env, host_env, gateway_env: more ``BATON_*`` settings.
        """
        if nats_store is not None:
            self.nats = _NatsWithStore(self.tmp / "nats", store=nats_store)
        if replicated:
            self.etcd, self.nats = EtcdCluster(self.tmp / "etcd"), NatsCluster(self.tmp / "nats")  # type: ignore[assignment]
        await asyncio.to_thread(self.etcd.start)
        await asyncio.to_thread(self.nats.start)
        etcd_endpoint = self.etcd.endpoints if replicated else self.etcd.endpoint  # type: ignore[attr-defined]
        if etcd_proxy:
            self.etcd_proxy = await TcpProxy(self.etcd.port).start()
            etcd_endpoint = self.etcd_proxy.endpoint
        logs = self.tmp / "logs"
        # Internal auth on, as in every deployment: the suite then also proves that each
        # internal call (keep-alive streams and watches included) carries the token.
        token = f"faults-token-{self.tag}"
        self.coordinator = await start_coordinator(  # type: ignore[assignment]
            etcd_endpoint, f"/{self.tag}/", log_dir=logs, detached_run_ttl=3600, reaper_interval=5,
            session_ttl=session_ttl, election_ttl=2, BATON_INTERNAL_TOKEN=token, **(coordinator_env or {}))
        self.env = {
            "BATON_INTERNAL_TOKEN": token,
            "BATON_RUNS_STREAM": f"RUNS_{self.tag}",
            "BATON_SUBJECT_PREFIX": f"baton.{self.tag}",
            "BATON_THREADS_BUCKET": f"threads-{self.tag}",
            "BATON_REPLAY_DIRS": str(CORPUS),
            "BATON_SESSION_TTL": str(session_ttl),
            "BATON_LOG_LEVEL": "INFO",
        }
        if replicated:
            self.env["BATON_LOG_REPLICAS"] = "3"
            await self._jetstream_ready()
        first = len(self.hosts) + 1
        self.hosts += await start_together([self._start_host(first + i, None, host_env or {}) for i in range(hosts)])
        assert self.coordinator is not None
        self.gateway = await start_gateway(self.coordinator.address, self.nats.url, log_dir=logs,
                                           **{**self.env, "BATON_SSE_KEEPALIVE": "1", **(gateway_env or {})})
        return self

    async def _jetstream_ready(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109 - a polling budget, as assert_eventually
        """Until the JetStream cluster has a meta leader (an R3 stream can be created)."""
        import nats

        nc = await nats.connect(self.nats.url.split(","), max_reconnect_attempts=-1)
        try:
            async def ready() -> None:
                try:
                    await nc.jetstream().account_info()
                except Exception as exc:  # noqa: BLE001 - not ready yet, whatever the reason
                    raise AssertionError(f"JetStream not ready: {exc!r}") from exc
            await eventually(ready, timeout, interval=0.2)
        finally:
            await nc.close()

    async def stream_leader(self) -> str:
        """The server name of the node leading the delivery-log stream (replicated only)."""
        import nats

        nc = await nats.connect(self.nats.url.split(","))
        try:
            info = await nc.jetstream().stream_info(self.env["BATON_RUNS_STREAM"])
        finally:
            await nc.close()
        assert info.cluster is not None and info.cluster.leader, info
        return info.cluster.leader

    def _server_procs(self) -> list[Any]:
        servers = [*getattr(self.etcd, "members", [self.etcd]), *getattr(self.nats, "nodes", [self.nats])]
        return [s.proc for s in servers if s.proc is not None and s.proc.poll() is None]

    async def add_host(self, *, coordinator: str | None = None, **settings: Any) -> HostProcess:
        """Start one more host; ``coordinator``: the address it dials (default: the
        coordinator's own; e.g. a :class:`TcpProxy` in between)."""
        h = await self._start_host(len(self.hosts) + 1, coordinator, settings)
        self.hosts.append(h)
        return h

    async def _start_host(self, n: int, coordinator: str | None, settings: dict[str, Any]) -> HostProcess:
        assert self.coordinator is not None
        return await start_host(coordinator or self.coordinator.address, self.nats.url, host_id=f"h{n}-{self.tag[:4]}",
                                log_dir=self.tmp / "logs", **{
                                    **self.env,
                                    "BATON_JOURNAL_DIR": str(self.tmp / "journals"),
                                    "BATON_SANDBOX_DIR": str(self.sandbox_dir),
                                    "BATON_ATTACH_WAIT": "3",
                                    "BATON_CANCEL_GRACE": "1",
                                    **{k: str(v) for k, v in settings.items()}})

    @property
    def sandbox_dir(self) -> pathlib.Path:
        return self.tmp / "sandboxes"

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    def host(self, host_id: str) -> HostProcess:
        return next(h for h in self.hosts if h.host_id == host_id)

    async def close(self) -> None:
        """Stop every reader and process, SIGCONT first (a stopped process cannot exit)."""
        for r in self.runs:
            if r.reader is not None:
                await r.reader.stop()
        with contextlib.suppress(Exception):
            await self.http.aclose()
        for proc in self._server_procs():
            proc.send_signal(signal.SIGCONT)
        if self.coordinator is not None:
            self.coordinator.resume()
        for h in self.hosts:
            h.sigcont()
        if self.gateway is not None:
            await self.gateway.stop(timeout=5)
        await asyncio.gather(*(h.stop(timeout=5) for h in self.hosts), return_exceptions=True)
        if self.coordinator is not None:
            await self.coordinator.stop(timeout=5)
        if self.etcd_proxy is not None:
            await self.etcd_proxy.close()
        await asyncio.to_thread(self.nats.kill)
        await asyncio.to_thread(self.etcd.kill)
        _kill_agents(self._run_ids())

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of every process log (for a failure message)."""
        out = []
        for p in sorted((self.tmp / "logs").glob("*.log")):
            tail = p.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {p.name}\n" + "\n".join(tail))
        return "\n".join(out)

    def _run_ids(self) -> set[str]:
        return {r.run_id for r in self.runs}

    # runs

    def new_run(self, journal: str = LONG, seconds: float = 8.0, *, detached: bool = False) -> FaultRun:
        i = len(self.runs)
        run_id, thread_id = f"f{self.tag}-{i}", f"f{self.tag}-t{i}"
        messages = [{"id": f"{run_id}-user", "role": "user", "content": f"replay {journal}"}]
        run = FaultRun(run_id, thread_id, journal, speed_for(CORPUS / journal, seconds), messages,
                       reference_chunks(CORPUS / journal, _format_of(journal), run_id, thread_id), detached=detached)
        self.runs.append(run)
        return run

    async def start_runs(self, n: int, journal: str = LONG, seconds: float = 8.0, *, detached: int = 0,
                         wait_started: bool = True) -> list[FaultRun]:
        """Start ``n`` runs through ``POST /api/chat``, each with a reader; the last
        ``detached`` of them lose their reader after the first chunk (the run goes on).

        Returns once every run delivered its first chunk (unless ``wait_started`` is false).
        """
        runs = [self.new_run(journal, seconds, detached=i >= n - detached) for i in range(n)]
        for r in runs:
            r.reader = Reader(self.http, self.url, r).start()
        if wait_started:
            await self.wait_first_chunks(runs)
        for r in runs:
            if r.detached and r.reader is not None:
                await r.reader.stop()
        return runs

    async def wait_first_chunks(self, runs: Sequence[FaultRun], timeout: float = 60.0) -> None:  # noqa: ASYNC109 - a polling budget, as assert_eventually
        """Until every run's reader got its first chunk; a reader that gave up fails at once."""
        async def started(rd: Reader) -> None:
            assert rd.task is not None
            got = asyncio.create_task(rd.first_chunk.wait())
            try:
                await asyncio.wait({got, rd.task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                got.cancel()
            if not rd.first_chunk.is_set():
                rd.task.result()  # its AssertionError (a 4xx), if any
                raise AssertionError(f"{rd.run.run_id}: the reader ended without a chunk")
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(started(r.reader) for r in runs if r.reader is not None))
        except TimeoutError as exc:
            raise AssertionError(f"runs did not start within {timeout}s\n{self.log_tails()}") from exc
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_tails()}") from exc

    async def view(self, run_id: str) -> dict[str, Any]:
        """``GET /api/runs/{runId}`` (``{}`` when unknown or the gateway does not answer)."""
        try:
            r = await self.http.get(f"{self.url}/api/runs/{run_id}", timeout=3)
        except httpx.TransportError:
            return {}
        return r.json() if r.status_code == 200 else {}  # type: ignore[no-any-return]

    async def drivers(self, runs: Iterable[FaultRun]) -> dict[str, str]:
        """run id → the host that drives it now (polled until every run has one)."""
        async def all_driven() -> dict[str, str]:
            views = {r.run_id: await self.view(r.run_id) for r in runs}
            assert all(v.get("driverHost") for v in views.values()), views
            return {k: v["driverHost"] for k, v in views.items()}
        return await eventually(all_driven, 30)

    async def busiest_host(self, runs: Sequence[FaultRun]) -> tuple[HostProcess, list[FaultRun]]:
        """The live host driving most of ``runs`` and the runs it drives."""
        owners = await self.drivers(runs)
        counts: dict[str, int] = {}
        for h in owners.values():
            counts[h] = counts.get(h, 0) + 1
        victim = max(sorted(counts), key=lambda h: counts[h])
        return self.host(victim), [r for r in runs if owners[r.run_id] == victim]

    async def wait_progress(self, runs: Sequence[FaultRun], chunks: int, timeout: float = 60.0) -> None:  # noqa: ASYNC109 - a polling budget, as assert_eventually
        """Until every live reader of ``runs`` got at least ``chunks`` chunks."""
        def enough() -> bool:
            return all(len(r.reader.got.items) >= chunks for r in runs if r.reader is not None and not r.detached)
        await eventually(enough, timeout)

    # the fault's window and the recovery time

    @contextlib.asynccontextmanager
    async def fault(self, what: str) -> AsyncIterator[None]:
        """Mark the fault's window: recovery is measured from the moment this block ends."""
        self.notes.append(what)
        self.fault_started = time.monotonic()
        yield
        self.fault_ended = time.monotonic()

    async def finish(self, runs: Sequence[FaultRun] | None = None, timeout: float = 120.0) -> None:  # noqa: ASYNC109 - a polling budget, as assert_eventually
        """Until every reader got the end of its log and every run has a terminal status;
        then the recovery time (fault end → every reader got its next chunk or the end)."""
        runs = list(self.runs if runs is None else runs)
        live = [r.reader for r in runs if r.reader is not None and not r.detached]

        async def ended() -> None:
            await asyncio.gather(*(rd.wait() for rd in live))
            async def terminal() -> bool:
                views = [await self.view(r.run_id) for r in runs]
                return all(v.get("status") in TERMINAL for v in views)
            await eventually(terminal, timeout)

        try:
            async with asyncio.timeout(timeout):
                await ended()
        except TimeoutError as exc:
            state = {r.run_id: (await self.view(r.run_id)).get("status") for r in runs}
            got = {r.run_id: (len(r.reader.got.items), r.reader.got.ended) for r in runs if r.reader is not None}
            raise AssertionError(f"runs did not end within {timeout}s: {state}\nreaders {got}\n"
                                 f"{self.log_tails()}") from exc
        done = time.monotonic()
        if self.fault_ended is not None:
            after = [rd.got.first_after(self.fault_ended) for rd in live]
            self.recovery = max([a - self.fault_ended for a in after if a is not None], default=0.0)
            if after:  # each live reader's wait, so one slow reader is told from all slow
                self.notes.append("readers' next chunk after " + ", ".join(
                    "-" if a is None else f"{a - self.fault_ended:.2f}s" for a in after))
            if not live:
                self.recovery = done - self.fault_ended

    # the checks

    async def stored_log(self, run_id: str) -> StoredLog:
        async with await DeliveryLog.connect(self.nats.url.split(","), LogConfig.from_env(self.env)) as dlog:
            recs = await dlog.stored_headers(run_id)
        return StoredLog(recs, {str(r.offset): r.origin or "" for r in recs if r.kind == "chunk"})

    async def fresh_read(self, run_id: str, timeout: float = 30.0) -> list[tuple[str, dict[str, Any]]]:  # noqa: ASYNC109 - a polling budget, as assert_eventually
        """``GET /api/chat?runId&offset=-1`` to the end (a page opened after the run)."""
        run = next(r for r in self.runs if r.run_id == run_id)
        rd = Reader(self.http, self.url, run).start(post=False)
        async with asyncio.timeout(timeout):
            await rd.wait()
        assert not rd.got.refusals, rd.got.refusals
        return [(o, c) for o, c, _ in rd.got.items if o is not None]

    async def check(self, runs: Sequence[FaultRun] | None = None) -> None:
        """Every comparison of the module docstring, for each run; then nothing left behind."""
        for r in (self.runs if runs is None else runs):
            await self.check_run(r)
        await self.check_nothing_left()

    async def check_run(self, run: FaultRun) -> None:
        """Compare one run with the uninterrupted replay of its journal (see module docstring)."""
        rid = run.run_id
        ref_fps = [fingerprint(c) for c in run.reference]

        # The raw stored log.
        stored = await self.stored_log(rid)
        recs = stored.records
        closes = [i for i, x in enumerate(recs) if x.kind == "close"]
        assert len(closes) == 1 and closes[0] == len(recs) - 1, \
            f"{rid}: want exactly one close, last; got closes at {closes} of {len(recs)} records"
        fence = 0
        for x in recs:
            assert x.epoch >= fence, f"{rid}: record {x.offset} ({x.kind}) of epoch {x.epoch} after the fence of {fence}"
            if x.kind == "fence":
                fence = max(fence, x.epoch)
        ids = [x.msg_id for x in recs if x.msg_id]
        assert len(ids) == len(set(ids)), f"{rid}: duplicate message ids {sorted({i for i in ids if ids.count(i) > 1})}"
        journal_fps = [x.fingerprint for x in recs if x.kind == "chunk" and x.origin == "journal"]
        assert journal_fps == ref_fps, f"{rid}: stored journal chunks differ from the uninterrupted replay " \
                                       f"({len(journal_fps)} stored, {len(ref_fps)} expected)"

        # A fresh full read: every stored chunk, in order, the journal ones equal to the replay.
        fresh = await self.fresh_read(rid)
        assert [o for o, _ in fresh] == list(stored.origin), f"{rid}: a fresh read differs from the stored offsets"
        assert [c for o, c in fresh if stored.origin[o] == "journal"] == run.reference, \
            f"{rid}: a fresh read's journal chunks differ from the uninterrupted replay"

        # The input was durable before the agent ran: the log opens with RUN_STARTED, then
        # run.accepted carrying the messages, before any chunk the agent's journal produced.
        accepted = [i for i, (o, c) in enumerate(fresh) if is_host_chunk(c, RUN_ACCEPTED)]
        journal_at = [i for i, (o, _) in enumerate(fresh) if stored.origin[o] == "journal"]
        assert fresh[0][1].get("type") == "RUN_STARTED", f"{rid}: the log opens with {fresh[0][1].get('type')}"
        assert len(accepted) == 1 and accepted[0] < journal_at[1], \
            f"{rid}: run.accepted at {accepted}, the agent's first chunk at {journal_at[1]}"
        assert fresh[accepted[0]][1].get("value", {}).get("messages") == run.messages, \
            f"{rid}: run.accepted lacks the input messages"

        # Every reader: exactly once, in order, nothing missing, the same chunks as the log.
        if run.reader is not None:
            got = run.reader.got
            offs = got.offsets
            assert len(offs) == len(set(offs)), f"{rid}: a reader got duplicates"
            assert offs == sorted(offs, key=int), f"{rid}: a reader got chunks out of order"
            by_offset = dict(fresh)
            assert all(by_offset.get(o) == c for o, c, _ in got.items if o is not None), \
                f"{rid}: a reader got chunks that differ from the stored ones"
            if not run.detached:
                assert got.ended, f"{rid}: the reader never got the end"
                assert offs == list(stored.origin), \
                    f"{rid}: the reader missed {sorted(set(stored.origin) - set(offs), key=int)[:10]}"

        # The saved transcript and the final status.
        resp = await self.http.get(f"{self.url}/api/threads/{run.thread_id}/messages")
        assert resp.status_code == 200, resp.text
        assert resp.json()["messages"] == run.transcript, f"{rid}: the saved transcript differs from the uninterrupted one"
        view = await self.view(rid)
        assert view.get("status") == run.expected_status, f"{rid}: status {view.get('status')}, want {run.expected_status}"

    async def check_nothing_left(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109 - a polling budget, as assert_eventually
        """No sandbox directory and no agent process of this cluster's runs is left."""
        ids = self._run_ids()

        def clean() -> None:
            left = sorted(p.name for p in self.sandbox_dir.iterdir()) if self.sandbox_dir.exists() else []
            assert not left, f"sandboxes left behind: {left}"
            procs = agent_processes(ids)
            assert not procs, f"agent processes left behind: {procs}"
        await eventually(clean, timeout)


# --- helpers ------------------------------------------------------------------------------------


async def eventually(check: Any, timeout: float, interval: float = 0.1) -> Any:  # noqa: ASYNC109 - a polling budget, as assert_eventually
    """Poll ``check`` (sync or async) until it returns truthy or ``None`` without raising
    AssertionError; raise the last AssertionError (or TimeoutError) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value is None or value:
                return value
            last: BaseException = TimeoutError(f"condition not met within {timeout}s")
        except AssertionError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise last
        await asyncio.sleep(interval)


def agent_processes(run_ids: set[str]) -> list[tuple[int, str]]:
    """``(pid, run id)`` of live processes whose environment names one of ``run_ids``
    (the local provider starts every agent with ``BATON_RUN_ID``)."""
    if not run_ids:
        return []
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue  # a zombie is gone, only its exit status is left for the parent
        for var in env.split(b"\0"):
            if var.startswith(b"BATON_RUN_ID="):
                rid = var.split(b"=", 1)[1].decode(errors="replace")
                if rid in run_ids:
                    out.append((int(d.name), rid))
    return out


def _kill_agents(run_ids: set[str]) -> None:
    """Teardown: no agent of a failed test outlives it."""
    for pid, _ in agent_processes(run_ids):
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
