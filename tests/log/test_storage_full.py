"""A full disk under nats-server, with a real nats-server whose JetStream store
lives on a 64 MB tmpfs that the test fills and frees.

What nats-server 2.15 does (checked here, documented in docs/operating-nats.md): publishes
are still acknowledged for a few seconds after the disk filled (they sit in the block
cache), then the block write fails with ENOSPC, and from then on every store to that
stream goes unanswered while reads, compare failures and duplicates still answer. Freeing
the disk does not help; a restart with free space does, and keeps every acknowledged record.
"""
from __future__ import annotations

import asyncio
import errno
import os
import pathlib
import subprocess
from typing import Any, Iterator

import nats.errors
import pytest

from baton.errors import LogStorageFull, LogUnavailable
from baton.log import DeliveryLog
from baton_tools.testing.servers import NatsServer
from tests.conftest import assert_eventually
from tests.log.conftest import chunk, unique_cfg

pytestmark = [pytest.mark.timeout(240), pytest.mark.servers]  # starts its own nats-server


@pytest.fixture
def tmpfs_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 64 MB tmpfs (needs root); skipped where it cannot be mounted, except under CI=true."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        reason = f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_nats(tmpfs_dir: pathlib.Path) -> Iterator[NatsServer]:
    server = NatsServer(tmpfs_dir)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def fill(directory: pathlib.Path) -> pathlib.Path:
    """Write zeros until the file system is full; returns the filler file."""
    filler = directory / "filler"
    block = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    # The last partial megabyte too: leave no room at all.
    with open(filler, "ab", buffering=0) as f:
        small = b"\0" * 4096
        while True:
            try:
                f.write(small)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return filler


async def read_all(log: DeliveryLog, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    async with log.read(run_id, after="-1") as r:
        async for offset, c in r:
            out.append((offset, c))
    return out


async def test_full_disk_is_storage_full_then_nothing_lost_after_restart(
    small_nats: NatsServer, tmpfs_dir: pathlib.Path
) -> None:
    log = await DeliveryLog.connect(small_nats.url, unique_cfg())
    try:
        await log.provision()
        run_id = "run-disk-1"
        w = log.writer(run_id, 1, publish_timeout=0.5)
        await w.fence()
        expected = [chunk(i) for i in range(200)]
        sent = 0
        await w.append(expected[:5])
        sent = 5
        await log.probe_storage("gw-test")  # stores fine before the fault

        filler = fill(tmpfs_dir)
        # Appends are acknowledged for a while (the block cache), then refused as storage full.
        full: LogStorageFull | None = None
        while full is None:
            assert sent < len(expected), "the full disk was never noticed"
            try:
                await w.append(expected[sent:sent + 1])
                sent += 1
            except LogStorageFull as exc:
                full = exc
                assert exc.landed == ()
        assert full.err_code is None and "answers reads" in full.detail
        # Retrying while full: the same answer, nothing doubled, and the writer keeps its epoch.
        with pytest.raises(LogStorageFull):
            await w.append(expected[sent:sent + 3])
        with pytest.raises(LogStorageFull):
            await log.probe_storage("gw-test", timeout=0.5)
        assert w.epoch == 1 and not w.latched

        filler.unlink()
        # Freed: nats-server 2.15 does not store again by itself (the stream keeps its write
        # error), which is why operating it means a restart once space is back.
        with pytest.raises(LogStorageFull):
            await log.probe_storage("gw-test", timeout=0.5)
        small_nats.restart()

        async def stores() -> bool:
            try:
                await log.probe_storage("gw-test", timeout=1.0)
            except (LogUnavailable, nats.errors.Error, asyncio.TimeoutError):  # not storing yet, or reconnecting
                return False
            return True

        await assert_eventually(stores, timeout=30)
        # The pending chunk goes out again with its message id; then the rest.
        while sent < len(expected):
            await w.append(expected[sent:sent + 20])
            sent = min(sent + 20, len(expected))
        assert await w.close("completed")

        got = await read_all(log, run_id)
        assert [c for _, c in got] == expected  # exactly once, in order
        offsets = [int(o) for o, _ in got]
        assert offsets == sorted(offsets)
        headers = await log.stored_headers(run_id)
        assert [h.kind for h in headers].count("close") == 1
        assert {h.epoch for h in headers} == {1}
    finally:
        await log.close()


class LimitedNats(NatsServer):
    """A nats-server whose JetStream may use at most ``max_file_store`` bytes."""

    max_file_store = 2 * 1024 * 1024

    def _argv(self) -> list[str]:
        argv = super()._argv()
        conf = self.data_dir / "limits.conf"
        conf.write_text(f"jetstream {{ max_file_store: {self.max_file_store} }}\n")
        return [*argv, "-c", str(conf)]


async def test_max_file_store_reached_is_refused_with_10023_and_clears_by_itself(tmp_path: pathlib.Path) -> None:
    server = LimitedNats(tmp_path / "limited")
    server.start()
    log = await DeliveryLog.connect(server.url, unique_cfg())
    try:
        await log.provision()
        w = log.writer("run-limit-1", 1, publish_timeout=2.0)
        await w.fence()
        expected = [chunk(i) for i in range(10)]
        await w.append(expected[:4])
        # Another stream takes the rest of the server's file store.
        js = log.nc.jetstream()
        await js.add_stream(name="BALLAST", subjects=["ballast"])
        while True:
            ack = await log.nc.request("ballast", b"\0" * 65536, timeout=5)
            if b'"error"' in ack.data:
                break
        with pytest.raises(LogStorageFull) as refused:
            await w.append(expected[4:6])
        assert refused.value.err_code == 10023 and refused.value.landed == ()
        with pytest.raises(LogStorageFull):
            await log.probe_storage("gw-test")

        # Space inside the limit comes back: stores work again with no restart.
        await js.delete_stream("BALLAST")
        await assert_eventually(stores_now(log), timeout=30)
        await w.append(expected[4:])
        assert await w.close("completed")
        assert [c for _, c in await read_all(log, "run-limit-1")] == expected
    finally:
        await log.close()
        server.kill()


def stores_now(log: DeliveryLog) -> Any:
    async def check() -> bool:
        try:
            await log.probe_storage("gw-test", timeout=1.0)
        except LogStorageFull:
            return False
        return True

    return check
