"""Fixtures of the gateway tests: a real coordinator (subprocess) on the shared etcd, a
unique delivery-log stream on the shared nats-server, and gateways served by uvicorn in
this event loop on free ports (or as ``python -m gateway`` subprocesses for end-to-end)."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import pathlib
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
import pytest
import uvicorn

from baton.coordinator_client import CoordinatorClient
from baton.log import DeliveryLog, LogConfig
from baton.sse import Comment, aiter_sse
from baton_tools.testing.servers import free_port
from gateway import GatewaySettings, create_app
from gateway._connection import uvicorn_options
from tests.conftest import REPO, assert_eventually, unique


@dataclasses.dataclass
class Gateway:
    """A gateway served in this event loop."""

    url: str
    app: Any
    server: uvicorn.Server
    task: asyncio.Task[None]

    @property
    def state(self) -> Any:
        return self.app.state.gateway

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.wait([self.task], timeout=15)


@pytest.fixture(scope="session")
async def coordinator(etcd: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    """A real coordinator subprocess (detached-run TTL long: no reaping during tests)."""
    from baton_tools.testing.cluster import start_coordinator

    h = await start_coordinator(etcd.endpoint, f"/{unique('gw')}/", log_dir=tmp_path_factory.mktemp("coord"),
                                detached_run_ttl=3600, session_ttl=2)
    yield h
    await h.stop()


@pytest.fixture(scope="session")
async def cc(coordinator: Any) -> AsyncIterator[CoordinatorClient]:
    async with CoordinatorClient(coordinator.address) as client:
        yield client


@pytest.fixture(scope="session")
def log_cfg() -> LogConfig:
    """A delivery-log stream, subject prefix and transcripts bucket of our own."""
    name = unique("GW").upper()
    return LogConfig(stream=name, subject_prefix=f"{name.lower()}.runs", bucket=f"{name.lower()}-threads")


@pytest.fixture(scope="session")
async def dlog(nats: Any, log_cfg: LogConfig) -> AsyncIterator[DeliveryLog]:
    log = await DeliveryLog.connect(nats.url, log_cfg)
    await log.provision()
    yield log
    await log.close()


@pytest.fixture(scope="session")
def replay_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """An allowed replay directory with a small claude journal (and one containing HTML)."""
    d = tmp_path_factory.mktemp("replay")
    (d / "claude-stream-json").mkdir()
    # The corpus's real journals, under their own names (tests/gateway/test_hydration_live.py).
    for kind in ("claude-stream-json", "codex-exec-json"):
        (d / kind).mkdir(exist_ok=True)
        for journal in sorted((REPO / "corpus" / kind).glob("*.jsonl")):
            (d / kind / journal.name).write_bytes(journal.read_bytes())
    (d / "claude-stream-json" / "hello.jsonl").write_text(claude_journal(["hello from the replay"]))
    (d / "claude-stream-json" / "slow.jsonl").write_text(claude_journal([f"part {i}. " for i in range(40)]))
    (d / "claude-stream-json" / "xss.jsonl").write_text(claude_journal(
        ["<script>window.__xss = 1</script>", '<img src=x onerror="window.__xss = 2">', "<b>bold?</b>"]))
    # Silent for 1.5 s between two messages (the replay paces by the lines' timestamps).
    silent = claude_journal(["before the silence", "after the silence"]).splitlines()
    for i, ts in ((1, "2025-01-01T00:00:00Z"), (2, "2025-01-01T00:00:01.500Z")):
        obj = json.loads(silent[i])
        obj["timestamp"] = ts
        silent[i] = json.dumps(obj)
    (d / "claude-stream-json" / "silent.jsonl").write_text("\n".join(silent) + "\n")
    # A run that starts with reasoning (a thinking block), then answers slowly.
    lines = claude_journal([f"part {i}. " for i in range(40)]).splitlines()
    think = json.loads(lines[1])
    think["message"] = {**think["message"], "id": "msg_think",
                        "content": [{"type": "thinking", "thinking": "Let me think.", "signature": "sig"}]}
    (d / "claude-stream-json" / "thinking.jsonl").write_text("\n".join([lines[0], json.dumps(think), *lines[1:]]) + "\n")
    return d


SLOW_TEXT = "".join(f"part {i}. " for i in range(40))


def claude_journal(texts: list[str]) -> str:
    """A minimal Claude stream-json journal: one assistant message per text, then a result."""
    lines: list[dict[str, Any]] = [
        {"type": "system", "subtype": "init", "session_id": "s1", "model": "m", "tools": [], "cwd": "/tmp"}]
    for i, text in enumerate(texts):
        lines.append({"type": "assistant", "session_id": "s1", "parent_tool_use_id": None,
                      "message": {"id": f"msg_{i}", "type": "message", "role": "assistant", "model": "m",
                                  "content": [{"type": "text", "text": text}], "stop_reason": None,
                                  "usage": {"input_tokens": 1, "output_tokens": 1}}})
    lines.append({"type": "result", "subtype": "success", "is_error": False, "result": texts[-1],
                  "session_id": "s1", "num_turns": 1, "duration_ms": 1, "total_cost_usd": 0.0,
                  "usage": {"input_tokens": 1, "output_tokens": 1}})
    return "".join(json.dumps(x) + "\n" for x in lines)


GatewayFactory = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def make_gateway(coordinator: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path
                       ) -> AsyncIterator[GatewayFactory]:
    """Start gateways in this loop: ``await make_gateway(keepalive=0.2, api_keys={...})``."""
    started: list[Gateway] = []

    async def make(**overrides: Any) -> Gateway:
        base: dict[str, Any] = dict(coordinator=(coordinator.address,), nats_url=nats.url, log_config=log_cfg,
                                    replay_dirs=(replay_dir,), gateway_id=unique("gw-"), keepalive=1.0)
        settings = GatewaySettings(**{**base, **overrides})
        app = create_app(settings)
        port = free_port()
        # The connection limits as python -m gateway applies them (gateway/_connection.py).
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=1, **uvicorn_options(settings.connections))
        server = uvicorn.Server(config)
        # Tests run in the main thread: keep uvicorn's hands off the process's signals.
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        task = asyncio.get_running_loop().create_task(server.serve())
        gw = Gateway(f"http://127.0.0.1:{port}", app, server, task)
        started.append(gw)
        deadline = asyncio.get_running_loop().time() + 20
        async with httpx.AsyncClient(trust_env=False) as http:
            while True:
                if task.done():
                    task.result()
                    raise RuntimeError("gateway exited during start")
                try:
                    if (await http.get(f"{gw.url}/readyz")).status_code == 200:
                        return gw
                except httpx.TransportError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError("gateway not ready")
                await asyncio.sleep(0.02)

    yield make
    for gw in started:
        await gw.stop()


@pytest.fixture
async def gateway(make_gateway: GatewayFactory) -> Gateway:
    return await make_gateway(keepalive=0.5)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        yield client


def run_chunks(run_id: str, thread_id: str, texts: list[str]) -> list[dict[str, Any]]:
    """A well-formed AG-UI run: RUN_STARTED, one text message of ``texts`` deltas, RUN_FINISHED."""
    mid = f"{run_id}-m1"
    chunks: list[dict[str, Any]] = [{"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id},
                                    {"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "assistant"}]
    chunks += [{"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": t} for t in texts]
    chunks += [{"type": "TEXT_MESSAGE_END", "messageId": mid},
               {"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id}]
    return chunks


async def write_run(dlog: DeliveryLog, run_id: str, chunks: list[dict[str, Any]], *, close: bool = True,
                    epoch: int = 1) -> tuple[Any, list[str]]:
    """Fence, append ``chunks`` (one record each) and optionally close; → (writer, offsets)."""
    w = dlog.writer(run_id, epoch)
    await w.fence()
    offsets = await w.append(chunks, origin="journal") if chunks else []
    if close:
        await w.close("completed")
    return w, offsets


@dataclasses.dataclass
class Received:
    """What a raw SSE/NDJSON read saw."""

    events: list[tuple[str | None, dict[str, Any]]]
    keepalives: int
    ended: bool  # the SSE end marker arrived
    status: int
    headers: httpx.Headers


async def read_stream(http: httpx.AsyncClient, method: str, url: str, *, ndjson: bool = False,
                      stop_after: int | None = None, **kw: Any) -> Received:
    """Read a whole SSE or NDJSON response (or ``stop_after`` chunks, then disconnect).

    With ``stop_after`` the read uses a client of its own, closed at the end, so the
    disconnect reaches the server for certain (no pooled connection is left behind).
    """
    if stop_after is not None:
        async with httpx.AsyncClient(trust_env=False, timeout=http.timeout) as own:
            return await _read_stream(own, method, url, ndjson=ndjson, stop_after=stop_after, **kw)
    return await _read_stream(http, method, url, ndjson=ndjson, stop_after=None, **kw)


async def _read_stream(http: httpx.AsyncClient, method: str, url: str, *, ndjson: bool,
                       stop_after: int | None, **kw: Any) -> Received:
    headers = dict(kw.pop("headers", {}))
    if ndjson:
        headers["Accept"] = "application/x-ndjson"
    events: list[tuple[str | None, dict[str, Any]]] = []
    keep = 0
    ended = False
    async with http.stream(method, url, headers=headers, **kw) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return Received([], 0, False, resp.status_code, resp.headers)
        if ndjson:
            async for line in resp.aiter_lines():
                if not line.strip():
                    keep += 1
                    continue
                env = json.loads(line)
                events.append((env.get("id"), env["chunk"]))
                if stop_after is not None and len(events) >= stop_after:
                    break
        else:
            async for item in aiter_sse(resp.aiter_bytes()):
                if isinstance(item, Comment):
                    if item.text == "end":
                        ended = True
                    else:
                        keep += 1
                    continue
                events.append((item.id, json.loads(item.data)))
                if stop_after is not None and len(events) >= stop_after:
                    break
        return Received(events, keep, ended, resp.status_code, resp.headers)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample in ``text`` (0 when absent)."""
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


async def wait_for_metric(http: httpx.AsyncClient, url: str, name: str, value: float, *,
                          headers: dict[str, str] | None = None, timeout: float = 15.0) -> None:
    """Poll the gateway's ``/metrics`` until the sample ``name`` reads ``value``."""
    async def reached() -> bool:
        return metric((await http.get(f"{url}/metrics", headers=headers)).text, name) == value
    await assert_eventually(reached, timeout=timeout)


def host_settings(log_cfg: LogConfig, replay_dir: pathlib.Path, tmp: pathlib.Path) -> dict[str, str]:
    """``BATON_*`` of a sandbox host that writes to our stream and replays from our dir."""
    return {
        "BATON_RUNS_STREAM": log_cfg.stream,
        "BATON_SUBJECT_PREFIX": log_cfg.subject_prefix,
        "BATON_THREADS_BUCKET": log_cfg.bucket,
        "BATON_REPLAY_DIRS": str(replay_dir),
        "BATON_JOURNAL_DIR": str(tmp / "journals"),
        "BATON_SANDBOX_DIR": str(tmp / "sandboxes"),
        "BATON_SESSION_TTL": "2",
        "BATON_CANCEL_GRACE": "1",
        "BATON_LOG_LEVEL": "INFO",
    }


@pytest.fixture(scope="module")
async def host(coordinator: Any, nats: Any, log_cfg: LogConfig, replay_dir: pathlib.Path,
               tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    """A real sandbox host subprocess for this test module."""
    from baton_tools.testing.cluster import start_host

    tmp = tmp_path_factory.mktemp("host")
    h = await start_host(coordinator.address, nats.url, log_dir=tmp, **host_settings(log_cfg, replay_dir, tmp))
    yield h
    await h.stop()


class CuttableProxy:
    """A TCP proxy to a gateway whose open connections can be cut (a dropped network)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self.connections = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> "CuttableProxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        me = asyncio.current_task()
        assert me is not None
        self._handlers.add(me)
        me.add_done_callback(self._handlers.discard)
        ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {w, uw}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        tasks = [asyncio.create_task(pipe(r, uw)), asyncio.create_task(pipe(ur, w))]
        self._tasks.update(tasks)
        await asyncio.wait(tasks)
        self._tasks.difference_update(tasks)
        self._writers -= {w, uw}

    def cut(self) -> None:
        """Abort every open connection (both sides see a reset)."""
        for w in list(self._writers):
            w.transport.abort()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        pending = list(self._tasks) + list(self._handlers)
        if pending:
            await asyncio.wait(pending)
