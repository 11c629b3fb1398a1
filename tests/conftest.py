"""Shared fixtures: one real etcd and one real nats-server per test session.

Tests isolate themselves with :func:`unique` prefixes/stream names. Tests that stop, kill or
restart a server use the function-scoped ``own_etcd`` / ``own_nats`` fixtures so they do not
disturb the shared ones.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import time
import uuid
from typing import Any, Awaitable, Callable, Iterator

import pytest

from baton_tools.testing.servers import EtcdServer, NatsServer

# gRPC honours proxy variables even for loopback addresses.
for _k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
    os.environ.pop(_k, None)
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

REPO = pathlib.Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Tear fixtures down on SIGTERM too (``timeout``, a CI job cancelled).

    Servers and components are started in their own sessions (``start_new_session``), so
    nothing ends them when pytest dies of an unhandled SIGTERM: etcd, nats-server,
    coordinators and hosts lingered as orphans holding ports and CPU. As a
    KeyboardInterrupt, pytest ends the session and runs every fixture's teardown.
    """
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _interrupt(signum: int, _frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, _interrupt)


def unique(prefix: str = "t") -> str:
    """A short unique name for isolating one test's keys, streams and ids."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


async def assert_eventually(
    check: Callable[[], Awaitable[Any] | Any], timeout: float = 10.0, interval: float = 0.02
) -> Any:
    """Poll ``check`` until it returns a truthy value (or stops raising AssertionError).

    Returns the truthy value. Raises the last AssertionError (or a TimeoutError) after
    ``timeout`` seconds. No fixed sleeps in tests: use this.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = check()
            if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
                value = await value
            if value:
                return value
            last = None
        except AssertionError as exc:
            last = exc
        if time.monotonic() > deadline:
            if last is not None:
                raise last
            raise TimeoutError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """The session's shared etcd (do not stop it; use ``own_etcd`` for that)."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """The session's shared nats-server with JetStream (do not stop it; use ``own_nats``)."""
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def own_etcd(tmp_path: pathlib.Path) -> Iterator[EtcdServer]:
    """An etcd for this test alone: free to stop, kill and restart."""
    server = EtcdServer(tmp_path / "own-etcd")
    server.start()
    yield server
    server.kill()


@pytest.fixture
def own_nats(tmp_path: pathlib.Path) -> Iterator[NatsServer]:
    """A nats-server for this test alone: free to stop, kill and restart."""
    server = NatsServer(tmp_path / "own-nats")
    server.start()
    yield server
    server.kill()
