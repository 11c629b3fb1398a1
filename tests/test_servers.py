"""The server fixtures themselves: real binaries that can be restarted on the same data."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import aetcd
import nats as nats_client
import pytest

from baton_tools.testing.servers import (EtcdServer, NatsServer, _ephemeral_range, free_port, free_ports_in_a_row,
                                         port_slice)
from tests.cli.conftest import processes_mentioning
from tests.conftest import REPO, assert_eventually, unique


async def test_etcd_restart_keeps_data(own_etcd: EtcdServer) -> None:
    host, port = own_etcd.endpoint.split(":")
    key = unique("/k").encode()
    async with aetcd.Client(host=host, port=int(port)) as client:
        await client.put(key, b"v1")
    own_etcd.kill()
    own_etcd.start()
    async with aetcd.Client(host=host, port=int(port)) as client:
        got = await client.get(key)
        assert got is not None and got.value == b"v1"


async def test_nats_jetstream_restart_keeps_stream(own_nats: NatsServer) -> None:
    name = unique("S")
    nc = await nats_client.connect(own_nats.url)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    ack = await js.publish(f"{name}.a", b"hello")
    await nc.close()
    own_nats.kill()
    own_nats.start()
    nc = await nats_client.connect(own_nats.url)
    js = nc.jetstream()
    msg = await js.get_msg(name, ack.seq)
    assert msg.data == b"hello"
    await nc.close()


HOLDING_TEST = """
import pathlib
import signal


def test_hold(own_etcd, own_nats):
    pathlib.Path(__file__).with_name("up").write_text("up")
    signal.pause()  # holds the servers until the outer test SIGTERMs this pytest
"""


@pytest.mark.servers
async def test_sigterm_to_pytest_tears_its_servers_down(tmp_path: pathlib.Path) -> None:
    # `timeout`, or a cancelled CI job, SIGTERMs pytest: the servers it started (each in its
    # own session) must not outlive it as orphans.
    (tmp_path / "test_hold.py").write_text(HOLDING_TEST)
    basetemp = tmp_path / "inner"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    output = tmp_path / "inner.log"
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
             "--rootdir", str(tmp_path), "-c", os.devnull, "--basetemp", str(basetemp), str(tmp_path / "test_hold.py")],
            cwd=str(REPO), env=env, stdout=out, stderr=subprocess.STDOUT)

    def servers() -> list[tuple[int, str]]:
        return [(pid, cmd) for pid, cmd in processes_mentioning(str(basetemp)) if pid != proc.pid]

    try:
        await assert_eventually(lambda: (tmp_path / "up").exists() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, output.read_text(errors="replace")
        assert len(servers()) == 2, servers()  # etcd and nats-server
        proc.send_signal(signal.SIGTERM)
        await assert_eventually(lambda: proc.poll() is not None, timeout=30)
        await assert_eventually(lambda: servers() == [], timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pid, _ in servers():  # a failing run must not leave them behind either
            os.kill(pid, signal.SIGKILL)


def test_free_ports_stay_out_of_the_range_outgoing_connections_take() -> None:
    # CI: etcd could not bind a port bind(0) had found free, because a client connection
    # took it as its source port in between. free_port() now never draws from that range.
    low, high = _ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert [p for p in ports if low <= p <= high] == []
    assert all(10000 <= p < low for p in ports)


def test_each_xdist_worker_draws_from_a_slice_of_its_own() -> None:
    """Two workers never hand out the same port: their slices do not meet, and together
    they cover the range below the ephemeral one."""
    low = _ephemeral_range()[0]
    slices = [port_slice({"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": "3"}) for i in range(3)]
    assert slices[0][0] == 10000 and all(a[1] < b[0] for a, b in zip(slices, slices[1:]))
    assert slices[-1][1] < low and low - slices[-1][1] <= 3
    assert port_slice({}) == (10000, low - 1)
    assert port_slice({"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "1"}) == (10000, low - 1)


def test_ports_in_a_row_are_all_free_and_never_handed_out_again() -> None:
    """A gateway's workers serve their metrics on ``P + i``: every port of the run is
    bindable now, inside this worker's slice, and :func:`free_port` never hands one out
    later (it handed ``P + 1`` to the next server, which took it first: "address already
    in use" in a clean-clone CI)."""
    first = free_ports_in_a_row(3)
    low, high = port_slice()
    assert low <= first and first + 2 <= high
    from baton_tools.testing import servers

    assert {first, first + 1, first + 2} <= servers._handed_out  # what free_port skips
    later = {free_port() for _ in range(300)}
    assert not later & {first, first + 1, first + 2}
