"""The Durable Streams bench's floor in several processes (bench/_ds_floor.py through
bench/durable_streams.py's start_floor / stop_floor): it serves appends on one port from every
worker, and nothing of it outlives the floor, whether it is stopped, loses a worker, or never
starts."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess

import httpx
import pytest

from baton_tools.testing.servers import NatsServer
from bench.durable_streams import start_floor, stop_floor
from tests.conftest import assert_eventually, process_state

pytestmark = [pytest.mark.timeout(120), pytest.mark.servers]  # starts floor processes


def _group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                out.append(int(d.name))
    return out


def _workers(proc: subprocess.Popen[bytes]) -> list[int]:
    return [p for p in _group(proc.pid) if p != proc.pid]


async def test_two_workers_serve_appends_and_stop_with_the_floor(nats: NatsServer, tmp_path: pathlib.Path) -> None:
    proc, url = start_floor(nats.url, tmp_path / "floor.log", 2)
    try:
        assert len(_workers(proc)) == 2
        # Connections the kernel spreads over both workers: every append is answered.
        for i in range(20):
            async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
                path = f"{url}/s{i}"
                assert (await http.put(path)).status_code == 201
                r = await http.post(path, content=b"x" * 256)
                assert r.status_code == 204 and r.headers["stream-next-offset"] == "1"
    finally:
        stop_floor(proc)
    assert proc.returncode is not None and _group(proc.pid) == []


async def test_a_worker_that_dies_takes_the_floor_down(nats: NatsServer, tmp_path: pathlib.Path) -> None:
    proc, _url = start_floor(nats.url, tmp_path / "floor.log", 2)
    try:
        # The one started last: a supervisor that waited for its workers in turn would not
        # see it go while the first still runs.
        os.kill(max(_workers(proc)), signal.SIGKILL)
        await assert_eventually(lambda: proc.poll() is not None and _group(proc.pid) == [], timeout=30)
    finally:
        stop_floor(proc)


def _floors_on(nats_url: str) -> list[int]:
    """Live processes of a floor started against ``nats_url``."""
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"bench._ds_floor" in argv and nats_url.encode() in argv and process_state(int(d.name)) not in ("", "Z", "X"):
                out.append(int(d.name))
    return out


def test_a_floor_that_cannot_start_leaves_nothing(tmp_path: pathlib.Path) -> None:
    nowhere = "nats://127.0.0.1:1"  # nothing listens there: every worker fails its start-up
    with pytest.raises(SystemExit, match="did not start"):
        start_floor(nowhere, tmp_path / "floor.log", 2)
    assert _floors_on(nowhere) == []
