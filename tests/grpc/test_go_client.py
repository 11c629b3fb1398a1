"""The Go example client (examples/go/runs_client) against a real cluster, built with
Debian's Go and grpc-go in GOPATH mode (the module proxy is unreachable) from stubs that
protoc generates here: streams a run, breaks its stream and resumes after its last offset,
streams on through a SIGKILL of the host driving the run, reads the transcript, cancels a run with wait; every chunk once, in order, byte-equal to
the SSE stream."""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, unique
from baton_tools.testing.cluster import start_host
from tests.gateway.conftest import SLOW_TEXT, host_settings
from tests.grpc.conftest import kill_driver_mid_run, sse_chunks

GOCODE = pathlib.Path("/usr/share/gocode")
TOOLS = ("go", "protoc", "protoc-gen-go-grpc")  # protoc-gen-go is built here from Debian's source


def need_go() -> None:
    """The Go toolchain and grpc-go; under CI=true their absence fails instead of skipping."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    missing += [str(p) for p in (GOCODE / "src/google.golang.org/grpc", GOCODE / "src/google.golang.org/protobuf")
                if not p.is_dir()]
    if missing:
        why = "Go toolchain missing (see .ci/run for the apt packages): " + ", ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)


async def _run(*cmd: str, env: dict[str, str], cwd: pathlib.Path | None = None, timeout: float = 600
               ) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*cmd, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except BaseException:  # timed out, or the test failed meanwhile: leave no process behind
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture(scope="module")
async def go_client(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    need_go()
    w = tmp_path_factory.mktemp("gopath")
    (w / "src").mkdir(parents=True)
    (w / "src" / "runs_client").mkdir(parents=True)
    # Go's own build cache (content-keyed, safe to share): grpc-go compiles once per machine,
    # not once per run (about 30 s of this test's 40 on a cold cache).
    cache = os.environ.get("GOCACHE") or (os.path.join(os.environ["HOME"], ".cache", "go-build")
                                          if os.environ.get("HOME") else str(w / "cache"))
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{w}:{GOCODE}", "GOCACHE": cache,
           "GOFLAGS": "", "CGO_ENABLED": "0", "PATH": f"{w / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    rc, out, err = await _run("go", "build", "-o", str(w / "bin" / "protoc-gen-go"),
                              "google.golang.org/protobuf/cmd/protoc-gen-go", env=env, cwd=w)
    assert rc == 0, out + err
    m = "Mbaton/v1/runs.proto=baton.dev/v1;batonv1,Mbaton/v1/runs_service.proto=baton.dev/v1;batonv1"
    rc, out, err = await _run("protoc", f"-I{REPO / 'protos'}", f"--go_out={w / 'src'}", f"--go_opt={m}",
                              f"--go-grpc_out={w / 'src'}", f"--go-grpc_opt={m}",
                              "baton/v1/runs.proto", "baton/v1/runs_service.proto", env=env)
    assert rc == 0, out + err
    shutil.copyfile(REPO / "examples" / "go" / "runs_client" / "main.go", w / "src" / "runs_client" / "main.go")
    binary = w / "runs_client-bin"
    rc, out, err = await _run("go", "build", "-o", str(binary), "runs_client", env=env, cwd=w)
    assert rc == 0, out + err
    return binary


@pytest.mark.timeout(900)
async def test_go_client(go_client: pathlib.Path, host: Any, grpc_gateway: Any, http: httpx.AsyncClient,
                         coordinator: Any, nats: Any, cc: Any, dlog: Any, log_cfg: Any, replay_dir: Any,
                         tmp_path: pathlib.Path) -> None:
    # A second host, so the run lives on when its driver is SIGKILLed mid-stream.
    other = await start_host(coordinator.address, nats.url, log_dir=tmp_path,
                             **host_settings(log_cfg, replay_dir, tmp_path))
    thread, run, thread2, run2 = unique("th"), unique("run"), unique("th"), unique("run")
    try:
        client = asyncio.create_task(_run(
            str(go_client), f"127.0.0.1:{grpc_gateway.state.grpc_port}", thread, run,
            "claude-stream-json/slow.jsonl", thread2, run2, env={**os.environ, "BATON_REPLAY_DELAY": "0.15"},
            timeout=120))
        killed = await kill_driver_mid_run(cc, dlog, [host, other], run, after_chunks=10)
        rc, out, err = await client
    finally:
        if not client.done():
            client.cancel()
            await asyncio.wait([client])
        await other.stop()
    assert killed
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines and rc == 0, f"stdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    result = json.loads(lines[-1])
    assert result["ok"], result

    chunks = [(o, j.encode()) for o, j in result["chunks"]]
    assert result["status"] == "completed" and result["resumedAt"] == 3
    offsets = [int(o) for o, _ in chunks]
    assert offsets == sorted(set(offsets))
    sse, ended = await sse_chunks(http, grpc_gateway.url, run)
    assert ended and sse == chunks
    assert "".join(json.loads(j).get("delta", "") for _, j in chunks) == SLOW_TEXT
    assert "".join(m["content"] for m in result["transcript"] if m["role"] == "assistant") == SLOW_TEXT

    assert result["cancelStatus"] == "RUN_STATUS_ABORTED" and result["cancelLogStatus"] == "aborted"
    sse2, _ = await sse_chunks(http, grpc_gateway.url, run2)
    assert sse2 == [(o, j.encode()) for o, j in result["cancelChunks"]]
    assert result["unknownCode"] == 5  # NOT_FOUND
