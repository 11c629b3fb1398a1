"""The TypeScript client package (clients/typescript, built into dist/ by `make ts-client`) against a
real cluster: clients/typescript/test/scenario.mjs starts a run through a TCP proxy that cuts its
connection after 3 chunks (the stream resumes on its own) while this test SIGKILLs the host
driving the run; joins from an offset, from the start and for new chunks only; reads the run,
transcript and listings; cancels a second run with wait; and gets errors with their gRPC code and
ErrorInfo reason. Every chunk once, in order, byte-equal to the SSE stream."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from typing import Any

import httpx
import pytest

from baton.log import latest_snapshot
from baton_tools.testing.cluster import start_host
from tests.conftest import REPO, unique
from tests.gateway.conftest import SLOW_TEXT, host_settings
from tests.grpc.conftest import kill_driver_mid_run, sse_chunks

PKG = REPO / "clients" / "typescript"
SCENARIO = PKG / "test" / "scenario.mjs"


def built_package() -> str:
    """node, with the package built from the current protos and source (`make ts-client`).

    Rebuilds dist/ when a .proto or the source is newer; under CI=true a missing prerequisite
    fails instead of skipping.
    """
    node, npm = shutil.which("node"), shutil.which("npm")
    missing = ("node/npm are not installed" if node is None or npm is None
               else "protoc is not installed" if shutil.which("protoc") is None
               else "clients/typescript/node_modules missing (make ts-client)"
               if not (PKG / "node_modules" / "@grpc" / "grpc-js").is_dir() else None)
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {missing}")
        pytest.skip(missing)
    assert node is not None and npm is not None
    dist = PKG / "dist" / "index.js"
    sources = [PKG / "src" / "index.ts", PKG / "scripts" / "gen.mjs", *(REPO / "protos" / "baton" / "v1").glob("*.proto")]
    if not dist.exists() or dist.stat().st_mtime < max(p.stat().st_mtime for p in sources):
        subprocess.run([npm, "run", "-s", "build"], cwd=PKG, check=True, timeout=120)
    return node


@pytest.mark.node
async def test_ts_client(host: Any, grpc_gateway: Any, http: httpx.AsyncClient, coordinator: Any, nats: Any,
                         cc: Any, dlog: Any, log_cfg: Any, replay_dir: Any, tmp_path: Any) -> None:
    node = built_package()
    # A second host, so the run lives on when its driver is SIGKILLed mid-stream.
    other = await start_host(coordinator.address, nats.url, log_dir=tmp_path,
                             **host_settings(log_cfg, replay_dir, tmp_path))
    thread, run, thread2, run2 = unique("th"), unique("run"), unique("th"), unique("run")
    proc = None
    try:
        proc = await asyncio.create_subprocess_exec(
            node, str(SCENARIO), f"127.0.0.1:{grpc_gateway.state.grpc_port}", thread, run,
            "claude-stream-json/slow.jsonl", thread2, run2, cwd=PKG,
            env={**os.environ, "BATON_REPLAY_DELAY": "0.1"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        killed = await kill_driver_mid_run(cc, dlog, [host, other], run, after_chunks=10)
        async with asyncio.timeout(90):
            out, err = await proc.communicate()
    finally:
        if proc is not None and proc.returncode is None:  # the test failed meanwhile
            proc.kill()
            await proc.wait()
        await other.stop()
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    assert lines, f"stdout: {out.decode()[-2000:]}\nstderr: {err.decode()[-2000:]}"
    result = json.loads(lines[-1])
    assert result["ok"] and proc.returncode == 0, result
    assert killed  # the driver died while the client streamed

    # Start: resumed on its own after the cut, every chunk once, in order, as SSE has them.
    chunks = [(o, j.encode()) for o, j in result["chunks"]]
    assert result["status"] == "completed" and result["resumes"] >= 1
    offsets = [int(o) for o, _ in chunks]
    assert offsets == sorted(set(offsets))
    sse, ended = await sse_chunks(http, grpc_gateway.url, run)
    assert ended and sse == chunks
    assert "".join(json.loads(j).get("delta", "") for _, j in chunks) == SLOW_TEXT
    # Joins from an offset and from the start; only-new on a closed log: its end alone.
    assert result["joinAfterOk"] and result["joinFromStartOk"]
    assert result["onlyNew"] == {"chunks": 0, "status": "completed"}
    # Unary reads.
    assert result["run"]["status"] == "RUN_STATUS_COMPLETED" and result["run"]["epoch"] >= 2
    assert result["active"] is None
    assert "".join(m["content"] for m in result["transcript"] if m["role"] == "assistant") == SLOW_TEXT
    assert result["listed"] == [run]
    assert "replay" in result["agents"]
    # Cancel with wait.
    assert result["cancel"] == {"requested": True, "status": "RUN_STATUS_ABORTED", "logStatus": "aborted"}
    # Errors: the gRPC code and the ErrorInfo reason (and metadata).
    errors = result["errors"]
    assert errors["getUnknown"] == {"code": "NOT_FOUND", "reason": "UNKNOWN_RUN", "domain": "baton.dev",
                                    "metadata": {"run_id": f"no-such-{run}"}}
    assert (errors["joinUnknown"]["code"], errors["joinUnknown"]["reason"]) == ("NOT_FOUND", "UNKNOWN_RUN")
    assert (errors["badOffset"]["code"], errors["badOffset"]["reason"]) == ("INVALID_ARGUMENT", "INVALID_OFFSET")
    bad_token, no_target = errors["badPageToken"], errors["cancelNothing"]
    assert (bad_token["code"], bad_token["reason"], bad_token["metadata"]["field"]) == \
        ("INVALID_ARGUMENT", "INVALID_ARGUMENT", "page_token")
    assert (no_target["code"], no_target["reason"]) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
    # Keeping a run while detached: clamped to the gateway's maximum; an ended run, a bad value.
    assert result["kept"] == {"granted": grpc_gateway.state.settings.detached_ttl_max, "requested": 1e9,
                              "untilOnRun": True}
    assert (errors["keepEnded"]["code"], errors["keepEnded"]["reason"]) == ("FAILED_PRECONDITION", "RUN_ENDED")
    assert (errors["keepBad"]["code"], errors["keepBad"]["metadata"]["field"]) == ("INVALID_ARGUMENT", "ttl_seconds")
    # The run's messages, paged from its final snapshot: every one once, in order.
    final = await latest_snapshot(dlog.nc, dlog.cfg, run)
    assert final is not None and result["messagesOffset"] == str(final[0].offset)
    assert result["messages"] == final[0].messages and result["messagesTotal"] == len(final[0].messages) > 2
    bad_cursor = errors["messagesBadCursor"]
    assert (bad_cursor["code"], bad_cursor["metadata"]["field"]) == ("INVALID_ARGUMENT", "before")
