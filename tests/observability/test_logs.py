"""Structured logs (``BATON_LOG_FORMAT=json``): every line of every service is one JSON object,
a run's lines carry its fields, and neither a client aborting its upload nor a shutdown with
an open stream logs an ERROR or a traceback (each is one INFO line).

A whole cluster of real processes (:class:`~tests.faults.harness.FaultCluster`).
"""
from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import pytest

from tests.faults.harness import SHORT, FaultCluster, eventually

pytestmark = pytest.mark.servers

JSON_LOGS = {"BATON_LOG_FORMAT": "json"}


def read_lines(logs: pathlib.Path) -> dict[str, list[dict[str, Any]]]:
    """Every line of every process log, parsed (a line that is not a JSON object fails)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(logs.glob("*.log")):
        parsed = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            try:
                obj = json.loads(line)
            except ValueError:
                raise AssertionError(f"{path.name}:{n} is not JSON: {line!r}") from None
            assert isinstance(obj, dict), f"{path.name}:{n}: {line!r}"
            for key in ("ts", "level", "logger", "msg", "service"):
                assert key in obj, f"{path.name}:{n} lacks {key}: {line!r}"
            parsed.append(obj)
        out[path.name] = parsed
    return out


async def abort_upload(url: str) -> None:
    """A client that sends half of a POST body and goes away (a closed tab mid-upload)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /api/chat HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: 100000\r\n\r\n" + b'{"threadId": "aborted", "messages": [' + b" " * 4000)
    await writer.drain()
    writer.transport.abort()


@pytest.mark.timeout(150)
async def test_json_logs_carry_the_run_and_client_aborts_and_shutdown_are_one_info_line(
        tmp_path: pathlib.Path) -> None:
    c = FaultCluster(tmp_path, "json-logs")
    logs = tmp_path / "logs"
    try:
        await c.start(hosts=1, coordinator_env=JSON_LOGS, host_env=JSON_LOGS, gateway_env=JSON_LOGS)
        assert c.gateway is not None
        # A run, driven to its end.
        [run] = await c.start_runs(1, SHORT, seconds=2)
        await c.finish()
        # A client aborting its upload.
        await abort_upload(c.url)

        def gateway_said(text: str) -> list[dict[str, Any]]:
            return [o for o in read_lines(logs)[c.gateway.log_path.name] if text in o["msg"]]  # type: ignore[union-attr]

        await eventually(lambda: assert_one(gateway_said("client went away")), 15)
        # A shutdown with an open stream: a reader of a long run, then SIGTERM.
        slow = c.new_run(seconds=30)
        got_chunk = asyncio.Event()
        ended = asyncio.Event()

        async def read() -> None:
            async with c.http.stream("POST", f"{c.url}/api/chat", json=slow.body) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        got_chunk.set()
            ended.set()

        reader = asyncio.create_task(read())
        try:
            async with asyncio.timeout(30):
                await got_chunk.wait()
            async with asyncio.timeout(10):  # ended at once, not after uvicorn's 5 s grace
                await asyncio.gather(c.gateway.stop(timeout=10), ended.wait())
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        assert not c.gateway.alive
        assert_one(gateway_said("ending 1 open stream(s)"))
    finally:
        await c.close()

    lines = read_lines(logs)
    bad = [(name, o) for name, objs in lines.items() for o in objs
           if o["level"] in ("ERROR", "CRITICAL") or "exc" in o or "Traceback" in o["msg"]]
    assert not bad, bad
    # The run's lines on its host carry the run's fields; the gateway's its run and thread.
    host_lines = [o for name, objs in lines.items() if name.startswith("h") for o in objs
                  if o.get("run_id") == run.run_id]
    assert host_lines, lines
    for o in host_lines:
        assert o["thread_id"] == run.thread_id and o["host"].startswith("h1-") and o["epoch"] == 1, o
    gw_lines = [o for name, objs in lines.items() if name.startswith("gateway") for o in objs
                if o.get("run_id") == run.run_id]
    assert gw_lines and all(o["thread_id"] == run.thread_id for o in gw_lines), gw_lines
    # uvicorn's own lines are in the one format too.
    assert any(o["logger"].startswith("uvicorn") for name, objs in lines.items() for o in objs)


def assert_one(found: list[dict[str, Any]]) -> None:
    assert len(found) == 1, found
    assert found[0]["level"] == "INFO", found
