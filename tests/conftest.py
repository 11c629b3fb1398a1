"""Shared fixtures: one real etcd and one real nats-server per test session.

Tests isolate themselves with :func:`unique` prefixes/stream names. Tests that stop, kill or
restart a server use the function-scoped ``own_etcd`` / ``own_nats`` fixtures so they do not
disturb the shared ones.

Also here, for every test:

- :func:`require` / ``@pytest.mark.requires(condition, reason=...)``: a missing prerequisite
  (Docker, node, chromium, docker-compose) skips outside CI and fails under ``CI=true``.
- the ``unit`` marker, set by :func:`pytest_collection_modifyitems` on every test that needs
  no server (``pytest -m unit``: the pure core in seconds).
- :func:`no_task_leaks`: a test that leaves asyncio tasks running fails.
- :func:`no_process_in_unit_tests`: a ``unit`` test that starts a process fails.
- :func:`shared_servers_survive`: the test during which a shared etcd or nats-server died
  fails, with the server's log, and the server is started again for the tests after it.
"""
from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import pytest
import pytest_asyncio

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


if os.environ.get("BATON_TEST_EVENT_LOOP", "asyncio") == "uvloop":
    # Defined only then: with no implementation pytest-asyncio makes its loops as always.
    def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                      ) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
        """``BATON_TEST_EVENT_LOOP=uvloop``: every test, with the in-process gateways and
        coordinators its fixtures build, runs on uvloop (the services' default loop,
        ``BATON_EVENT_LOOP``); unset or ``asyncio``: on the standard loop."""
        import uvloop

        return {"uvloop": uvloop.new_event_loop}


#: ``CI=true`` (as .ci/run sets): a prerequisite the machine lacks is a failure, not a skip.
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(condition: object, reason: str) -> None:
    """Go on when ``condition`` holds; else skip with ``reason``, or fail under CI.

    Outside CI a machine without Docker, node or chromium skips what it cannot run (docs/development.md:
    `make test` only skips what the machine lacks). Under ``CI=true`` the setup promised
    them, so a missing one must turn the run red instead of silently skipping its tests.
    """
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI prerequisite missing: {reason}", pytrace=False)
    pytest.skip(reason)


# Fixtures that start or need a server (etcd, NATS, processes); a test whose fixture closure
# holds none of them, and that has none of SERVER_MARKS, is a `unit` test.
SERVER_FIXTURES = frozenset({"etcd", "nats", "own_etcd", "own_nats"})
SERVER_MARKS = frozenset({"docker", "node", "browser", "slow", "requires"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the server-free tests ``unit`` (by what they use, so no list goes stale).

    The fixture closure is transitive: a test using a cluster fixture that uses ``etcd`` is
    not a unit test. Tests that spawn servers by hand sit in modules marked
    ``pytestmark = pytest.mark.servers`` (see ``SERVER_MARKS``).
    """
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        marks = {m.name for m in item.iter_markers()}
        if not used & SERVER_FIXTURES and not marks & (SERVER_MARKS | {"servers"}):
            item.add_marker(pytest.mark.unit)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Apply ``@pytest.mark.requires(condition, reason=...)`` through :func:`require`."""
    for mark in item.iter_markers("requires"):
        condition = mark.args[0] if mark.args else mark.kwargs["condition"]
        require(condition, mark.kwargs.get("reason") or (mark.args[1] if len(mark.args) > 1 else "unmet"))


def _refuse_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every way to start a process raise, and return the list of attempts."""
    attempts: list[str] = []
    test = request.node.nodeid

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            attempts.append(f"{what}{args[1:2] if what == 'subprocess.Popen' else args[:1]}")
            raise AssertionError(
                f"{test} is a unit test and started a process ({what}): make it pure, or mark its "
                "module `servers` (tests/conftest.py)")
        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("subprocess.Popen"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    return attempts


@pytest.fixture(autouse=True)
def no_process_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A ``unit`` test that starts a process (subprocess, asyncio's subprocesses, git, a
    fork) fails, even when the code under test caught the refusal: "unit" means no process.
    """
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    attempts = _refuse_processes(request, monkeypatch)
    yield
    if attempts:
        pytest.fail(f"a unit test started {len(attempts)} process(es): {attempts[:3]}", pytrace=False)


# How long tasks a test started may take to finish after it (cancelled tasks unwinding,
# a close() callback scheduled on the loop) before they count as leaked.
TASK_LEAK_GRACE = 2.0
# Seconds one step of the event loop may take before asyncio's debug mode logs it.
SLOW_CALLBACK = 1.0


@pytest_asyncio.fixture(autouse=True, loop_scope="session")
async def no_task_leaks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running on the session loop.

    Autouse, so it is set up before and torn down after the test's own function-scoped
    fixtures: tasks those fixtures own are awaited by their teardown first. Tasks of module
    or session fixtures already exist when the snapshot is taken. Leaked tasks are cancelled
    after the failure so they cannot disturb the next test.

    Also sets the loop's slow-callback report (asyncio debug mode, pyproject.toml) to
    :data:`SLOW_CALLBACK`: debug mode's 0.1 s default logs every step of a loaded machine.
    """
    asyncio.get_running_loop().slow_callback_duration = SLOW_CALLBACK
    before = asyncio.all_tasks()
    yield
    deadline = time.monotonic() + TASK_LEAK_GRACE
    while True:
        leaked = asyncio.all_tasks() - before - {asyncio.current_task()}
        if not leaked or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    if not leaked:
        return
    described = sorted(_describe(t) for t in leaked)
    for t in leaked:
        t.cancel()
    await asyncio.wait(leaked, timeout=TASK_LEAK_GRACE)
    pytest.fail(f"{len(leaked)} asyncio task(s) outlived the test: " + "; ".join(described), pytrace=False)


def _describe(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    where = f" {code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    return f"{task.get_name()} {getattr(coro, '__qualname__', coro)!s}{where}"


def process_state(pid: int) -> str:
    """The one-letter state of a process in ``/proc`` (``T``: stopped; ``""``: gone)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


async def freeze(proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP ``proc`` and return once it is stopped (``/proc`` state ``T``).

    The signal is delivered asynchronously: a request sent right after ``send_signal``
    could still be answered (CI saw both etcd and nats-server do so under load).
    """
    proc.send_signal(signal.SIGSTOP)
    await assert_eventually(lambda: process_state(proc.pid) == "T", timeout=10, interval=0.005)


def unique(prefix: str = "t") -> str:
    """A short unique name for isolating one test's keys, streams and ids."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


async def assert_throughout(check: Callable[[], Awaitable[Any] | Any], seconds: float, interval: float = 0.25) -> None:
    """Assert ``check`` holds for the whole of ``seconds``: it is run every ``interval``
    seconds and must not raise. An observation window (a state that must *stay* true, such
    as "no failover while the store is full"), the counterpart of :func:`assert_eventually`;
    the interval is the sampling rate, not a wait for something to happen.

    Raises:
        AssertionError: the first sample at which ``check`` failed.
    """
    end = time.monotonic() + seconds
    while True:
        value = check()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            await value
        if time.monotonic() >= end:
            return
        await asyncio.sleep(min(interval, max(end - time.monotonic(), 0)))


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


def eventually(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """:func:`assert_eventually` for code without an event loop: poll ``check`` until it
    returns a truthy value (returned); ``TimeoutError(what)`` after ``timeout`` seconds.
    ``check`` may raise to stop at once (a process that exited)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} (within {timeout} s)")
        time.sleep(interval)


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


def _revive(request: pytest.FixtureRequest, when: str) -> None:
    """Start again every shared server of this test that has exited; then fail naming each,
    with the end of its log."""
    dead = []
    for name in ("etcd", "nats"):
        if name not in request.fixturenames:
            continue
        server = request.getfixturevalue(name)
        if server.proc is None or server.proc.poll() is None:
            continue
        report = f"the shared {name} exited with {server.proc.returncode} {when}; the end of its log:\n" \
                 f"{server.log_tail()}"
        try:
            server.start()
        except Exception as exc:  # noqa: BLE001 -- reported with the exit
            report += f"\nstarting it again failed: {exc!r}"
        else:
            report += "\n(started again for the tests after this one)"
        dead.append(report)
    if dead:
        pytest.fail("\n\n".join(dead), pytrace=False)


@pytest.fixture(autouse=True)
def shared_servers_survive(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test during which a shared etcd or nats-server exited, and start it again.

    Autouse, so its teardown runs after the test's own fixtures' (a coordinator stopped at
    teardown is still this test's). Without it, one exit fails every later test on the xdist
    worker with errors that do not name the cause. The etcd of the tests (3.5.1) panics when a
    client cancels a read-only transaction while etcd runs it, etcd-io/etcd#14110
    (docs/deploy.md): a client process SIGKILLed in the middle of a read does that.
    """
    _revive(request, "before this test")
    yield
    _revive(request, "during this test")


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


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fuzz suite's figures (tests/fuzz): inputs tried per surface, printed here (the
    root conftest) so the controller of an xdist run prints them too."""
    from tests.fuzz._harness import terminal_summary

    terminal_summary(terminalreporter, _SESSION_STARTED)


_SESSION_STARTED = time.time()
