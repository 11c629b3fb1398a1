"""Finishing while the store is unavailable.

The coordinator reaches etcd through a TCP proxy that the test takes down right when the
run finishes. Before the fix the host logged ``driver ended (completed)``, then crashed on
``StoreUnavailable`` from the final status write: no close record, the record ``running``
and claimed forever, the sandbox left behind.

* A short outage: the host retries its final writes within its budget; the run ends
  ``completed`` by the same claim, with exactly one close record; a reader connected the
  whole time gets every chunk once and the end; the sandbox is gone.
* An outage longer than the host's budget: the host closes the log (NATS is up), gives up
  on the status, lets the run go (releases its claim once the store answers), and another
  owner finalizes the record from the stored close record.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
from types import SimpleNamespace
from typing import Any, AsyncIterator

import pytest

from baton.errors import StoreUnavailable
from baton.ids import file_stem
from baton.runs import RUN_ACCEPTED
from baton_tools.testing.servers import EtcdServer, NatsServer
from baton.v1 import runs_pb2
from sandbox_host.translate import translate_bytes
from tests.conftest import assert_eventually
from tests.driver.conftest import CORPUS, Cluster, make_cluster, status_of

JOURNAL = "claude-stream-json/partial-messages-bash-exit-128.jsonl"
DELAY = 0.02  # seconds per journal line
MESSAGES = [{"id": "u1", "role": "user", "content": "replay it"}]


class EtcdLink:
    """A TCP proxy between the coordinator and etcd that can be taken down (every open
    connection reset, new ones refused) and brought back."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.port = 0
        self.is_down = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> "EtcdLink":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if self.is_down:
            w.transport.abort()
            return
        me = asyncio.current_task()
        assert me is not None
        self._tasks.add(me)
        me.add_done_callback(self._tasks.discard)
        try:
            ur, uw = await asyncio.open_connection(*self.target)
        except OSError:
            w.transport.abort()
            return
        self._writers |= {w, uw}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(r, uw), pipe(ur, w))
        self._writers -= {w, uw}

    def down(self) -> None:
        self.is_down = True
        for w in list(self._writers):
            w.transport.abort()

    def up(self) -> None:
        self.is_down = False

    async def close(self) -> None:
        self.down()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)


@pytest.fixture
async def link(etcd: EtcdServer) -> AsyncIterator[EtcdLink]:
    lk = await EtcdLink(etcd.endpoint).start()
    try:
        yield lk
    finally:
        await lk.close()


async def _cluster(link: EtcdLink, nats: NatsServer, tmp: pathlib.Path, **settings: Any) -> Cluster:
    # A session TTL well above the outage: the host keeps its claim through it.
    return await make_cluster(SimpleNamespace(endpoint=link.endpoint), nats, tmp, hosts=1,  # type: ignore[arg-type]
                              BATON_SESSION_TTL="10", **settings)


async def _run_through_an_outage(c: Cluster, link: EtcdLink, *, until_log: str) -> tuple[str, str, list[dict[str, Any]]]:
    """Start a run; take the store down a few chunks before its end; bring it back once the
    driving host logged ``until_log`` (with the run id). Returns (run id, thread id, chunks a
    reader connected the whole time got)."""
    host = c.hosts[0]
    started = await c.start_run(host, JOURNAL, delay=DELAY, messages=MESSAGES)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    expected = translate_bytes("claude-stream-json", (CORPUS / JOURNAL).read_bytes(), run_id, thread_id)
    got: list[dict[str, Any]] = []
    cut_at = len(expected) + 1 - 4  # a few chunks before the end (run.accepted is extra)

    async def read() -> None:
        async with c.log.read(run_id, after="-1") as r:
            async for _off, chunk in r:
                got.append(chunk)
                if len(got) == cut_at:
                    link.down()

    reader = asyncio.create_task(read())
    try:
        await assert_eventually(lambda: link.is_down, timeout=60, interval=0.01)
        await assert_eventually(lambda: f"run {run_id}: {until_log}" in host.log_text(), timeout=60, interval=0.05)
    finally:
        link.up()
    async with asyncio.timeout(60):
        await reader  # readers get the end
    assert got[0] == expected[0] and got[1]["name"] == RUN_ACCEPTED
    assert [got[0], *got[2:]] == expected  # each chunk once, in order
    return run_id, thread_id, got


async def _wait_status(c: Cluster, run_id: str, status: str, timeout: float) -> runs_pb2.RunRecord:
    """Poll the record until it has ``status``; the coordinator may still be reconnecting
    to etcd after the outage (its calls answer ``StoreUnavailable`` meanwhile)."""
    async def check() -> runs_pb2.RunRecord:
        try:
            rec = await c.record(run_id)
        except StoreUnavailable as exc:
            raise AssertionError(f"store still unavailable: {exc}") from None
        assert status_of(rec) == status, f"status {status_of(rec)}, want {status}"
        return rec

    return await assert_eventually(check, timeout=timeout, interval=0.1)


def _sandbox_gone(c: Cluster, run_id: str) -> bool:
    sandboxes = c.tmp / "sandboxes"
    return not any(n.startswith(file_stem(run_id)) for n in (os.listdir(sandboxes) if sandboxes.exists() else []))


@pytest.mark.timeout(180)
async def test_a_run_finishing_during_a_store_blip_ends_completed_by_its_host(
        link: EtcdLink, nats: NatsServer, tmp_path: pathlib.Path) -> None:
    c = await _cluster(link, nats, tmp_path)
    try:
        # The outage lasts until the host retried its final status at least once.
        run_id, thread_id, got = await _run_through_an_outage(c, link, until_log="final status unavailable, retrying")
        rec = await _wait_status(c, run_id, "completed", timeout=90)
        assert rec.driver_epoch == 1 and rec.driver_host == c.hosts[0].host_id  # no takeover was needed
        heads = await c.log.stored_headers(run_id)
        closes = [h for h in heads if h.kind == "close"]
        assert len(closes) == 1 and closes[0].status == "completed" and heads[-1].kind == "close"
        async def released() -> bool:
            return (await c.cc.get_run(run_id)).claim is None
        await assert_eventually(released, timeout=30)
        await assert_eventually(lambda: _sandbox_gone(c, run_id), timeout=30)
        msgs, _ = await c.transcripts.load(thread_id)
        assert msgs[0] == MESSAGES[0] and msgs[-1]["role"] == "assistant"
        assert "driver crashed" not in c.hosts[0].log_text()
    finally:
        await c.close()


@pytest.mark.timeout(180)
async def test_a_store_outage_longer_than_the_budget_lets_the_run_go_to_another_owner(
        link: EtcdLink, nats: NatsServer, tmp_path: pathlib.Path) -> None:
    c = await _cluster(link, nats, tmp_path, BATON_FINISH_BUDGET="1")
    try:
        # The outage lasts until the host gave up on the final status (after its 1 s budget).
        run_id, _thread_id, _got = await _run_through_an_outage(c, link, until_log="status gave-up")
        # Once the store answers, the host releases its claim; the leader hands the run to a
        # live host (here the same one, with a new claim), which finds the log closed and
        # finalizes the record from the close record.
        rec = await _wait_status(c, run_id, "completed", timeout=90)
        assert rec.driver_epoch == 2
        heads = await c.log.stored_headers(run_id)
        closes = [h for h in heads if h.kind == "close"]
        assert len(closes) == 1 and closes[0].status == "completed" and closes[0].epoch == 1
        assert heads[-1].kind == "close"  # the successor wrote nothing to the closed log
        await assert_eventually(lambda: _sandbox_gone(c, run_id), timeout=30)
        async def released() -> bool:
            return (await c.cc.get_run(run_id)).claim is None
        await assert_eventually(released, timeout=30)
        assert "driver crashed" not in c.hosts[0].log_text()
    finally:
        await c.close()
