"""The Python gRPC client (baton.grpc_client): typed operations, automatic resume after a
cut connection with every chunk once and in order, domain errors, no server imports."""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

from baton import errors as e
from baton.grpc_client import RunsClient, RunsError
from baton.v1 import runs_pb2
from tests.conftest import REPO, assert_eventually, unique
from tests.gateway.conftest import SLOW_TEXT, CuttableProxy
from tests.grpc.conftest import sse_chunks


@pytest.mark.servers  # starts processes: not a unit test
def test_imports_without_server_dependencies() -> None:
    code = ("import sys, baton.grpc_client; "
            "bad = [m for m in ('starlette', 'gateway', 'nats', 'aetcd', 'uvicorn', 'httpx', 'coordinator', "
            "'sandbox_host', 'pydantic') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def test_client_resumes_across_cut_connections(host: Any, grpc_gateway: Any, http: httpx.AsyncClient) -> None:
    proxy = await CuttableProxy(grpc_gateway.state.grpc_port).start()
    try:
        async with RunsClient(f"127.0.0.1:{proxy.port}") as runs:
            thread, run = unique("th"), unique("run")
            stream = runs.start(run, thread, [{"id": "u1", "role": "user", "content": "go"}],
                                agent={"kind": "replay", "journal": "claude-stream-json/slow.jsonl",
                                       "speed": 1, "delay": 0.05})
            got = []
            async for chunk in stream:
                got.append(chunk)
                if len(got) in (3, 12):
                    proxy.cut()  # the network drops mid-stream, twice
            assert stream.status == "completed" and stream.resumes >= 2
            offsets = [int(c.offset) for c in got]
            assert offsets == sorted(set(offsets))
            assert "".join(c.event.get("delta", "") for c in got) == SLOW_TEXT
            sse, ended = await sse_chunks(http, grpc_gateway.url, run)
            assert ended and sse == [(c.offset, c.json) for c in got]

            # The other operations, typed.
            assert [c.offset for c in (await _all(runs.join(run, after=got[5].offset)))] == [c.offset for c in got[6:]]
            info = await runs.get_run(run)
            assert info.status == runs_pb2.RUN_STATUS_COMPLETED and info.thread_id == thread
            # The stream ends with the log's close; the record's terminal status is the
            # host's next write (docs/design.md: the one-write window), so the thread's
            # active run is gone once that landed.
            async def no_active_run() -> bool:
                assert await runs.active_run(thread) is None
                return True
            await assert_eventually(no_active_run, timeout=10)
            msgs = await runs.transcript(thread)
            assert "".join(m["content"] for m in msgs if m["role"] == "assistant") == SLOW_TEXT
            assert [r.run_id async for r in runs.list_runs(thread_id=thread)] == [run]
            assert (await runs.agents()).default_kind == "replay"
            with pytest.raises(e.UnknownRun):
                await _all(runs.join(unique("missing")))
            with pytest.raises(e.InvalidOffset):
                await _all(runs.join(run, after="zz"))
    finally:
        await proxy.close()


async def test_client_errors_and_cancel(host: Any, make_gateway: Any) -> None:
    gw = await make_gateway(keepalive=0.5, grpc_listen="127.0.0.1:0", api_keys={"ka": "alpha"})
    target = f"127.0.0.1:{gw.state.grpc_port}"
    async with RunsClient(target) as anon:
        with pytest.raises(RunsError) as info:
            await anon.get_run("r1")
        assert info.value.reason == "UNAUTHENTICATED"
    async with RunsClient(target, api_key="ka") as runs:
        thread, run = unique("th"), unique("run")
        stream = runs.start(run, thread, [{"id": "u1", "role": "user", "content": "go"}],
                            agent={"kind": "replay", "journal": "claude-stream-json/slow.jsonl", "speed": 1,
                                   "delay": 0.2})
        async for _ in stream:
            break
        with pytest.raises(e.ThreadBusy):
            await _all(runs.start(unique("run"), thread, [], agent={"kind": "replay",
                                                                     "journal": "claude-stream-json/hello.jsonl"}))
        out = await runs.cancel(run_id=run, wait=True, timeout=60)
        assert out.run.status == runs_pb2.RUN_STATUS_ABORTED
        rest = runs.join(run)
        await _all(rest)
        assert rest.status == "aborted"


async def _all(stream: Any) -> list[Any]:
    return [c async for c in stream]
