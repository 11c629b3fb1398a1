"""A TanStack AI durable chat whose durability log is a Durable Stream on baton's ``/ds``.

tests/node/ds/tanstack_durable_chat.mjs serves a chat with ``@tanstack/ai``'s own durable
responses (``toServerSentEventsResponse(chat(...), { durability })``, resumes with
``resumeServerSentEventsResponse``); the sink is tests/node/ds/ds_durability.mjs, our stand-in
for ``@tanstack/ai-durable-stream`` (not published on npm) with its wire contract: a JSON
stream per run at ``<server>/streams/<prefix>%2F<runId>``, producer appends, a closing POST,
SSE reads. The script asserts what the chat's clients see (every chunk once, in order; a
disconnect then a resume by ``Last-Event-ID`` and by ``?offset=`` gets exactly the rest; the
stream ends closed) and this test reads the stored runs back from baton over the protocol.
The same script runs against the protocol's reference server (``@durable-streams/server``):
the sink is not written for baton.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator
from urllib.parse import quote

import httpx
import pytest

from tests.conftest import unique
from tests.gateway.conftest import Gateway
from tests.gateway.test_node import NODE_DIR, need_node, run_node

SCRIPT = "ds/tanstack_durable_chat.mjs"
PACKAGES = ("@tanstack/ai", "@durable-streams/client")


@pytest.fixture
async def reference_server() -> AsyncIterator[str]:
    """The protocol's reference server (in memory) on a free port: its URL."""
    node = need_node("@durable-streams/server")
    proc = await asyncio.create_subprocess_exec(node, "ds_reference_server.mjs", "0", cwd=NODE_DIR,
                                                stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            line = await proc.stdout.readline()
        assert line.startswith(b"http://"), line
        yield line.decode().strip()
    finally:
        proc.terminate()
        await proc.wait()


@pytest.mark.node
@pytest.mark.timeout(120)
async def test_tanstack_durable_chat_writes_and_reads_its_run_through_baton(gateway: Gateway) -> None:
    node = need_node(*PACKAGES)
    server = f"{gateway.url}/ds"
    result = await run_node(node, SCRIPT, {"DS_SERVER": server}, timeout=60)
    runs: list[dict[str, Any]] = result["runs"]
    assert len(runs) == 2
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        for run in runs:
            # The adapter's stream name: "<prefix>/<runId>" as one percent-encoded segment.
            assert run["url"] == f"{server}/streams/chat%2F{run['runId']}"
            # Read afterwards from the start, through the protocol: closed, the chunks the
            # chat's client got, numbered 1.. once each.
            got = await http.get(run["url"], params={"offset": "-1"})
            assert got.status_code == 200, got.text
            assert got.headers["stream-closed"] == "true"
            records = got.json()
            assert [r["seq"] for r in records] == list(range(1, len(run["chunks"]) + 1))
            assert [r["chunk"] for r in records] == run["chunks"]
            assert run["chunks"][-1]["type"] == "RUN_FINISHED"


@pytest.mark.node
@pytest.mark.timeout(60)
async def test_the_same_chat_runs_against_the_reference_server(reference_server: str) -> None:
    node = need_node(*PACKAGES)
    result = await run_node(node, SCRIPT, {"DS_SERVER": reference_server}, timeout=60)
    assert [r["chunks"][-1]["type"] for r in result["runs"]] == ["RUN_FINISHED", "RUN_FINISHED"]


@pytest.fixture(params=["baton", "reference"])
def ds_base(request: pytest.FixtureRequest) -> str:
    """The base URL of a Durable Streams server: baton's ``/ds`` or the reference server."""
    if request.param == "baton":
        gw: Gateway = request.getfixturevalue("gateway")
        return f"{gw.url}/ds"
    return request.getfixturevalue("reference_server")  # type: ignore[no-any-return]


@pytest.mark.node
async def test_a_percent_encoded_slash_names_its_own_stream(ds_base: str) -> None:
    # The adapter's stream names carry "/" as %2F inside one path segment. A server keys
    # streams by the path as sent (the reference server by `new URL(req.url).pathname`), so
    # "a%2Fb" and "a/b" are two streams, and baton's run-log paths (/runs/<id>) are not
    # reachable through "runs%2F<id>".
    name = unique("enc")
    ct = {"content-type": "application/json"}
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        encoded, plain = f"{ds_base}/streams/{name}%2Fa", f"{ds_base}/streams/{name}/a"
        assert (await http.put(encoded, headers=ct)).status_code == 201
        assert (await http.get(plain, params={"offset": "-1"})).status_code == 404
        assert (await http.put(plain, headers=ct)).status_code == 201
        assert (await http.post(encoded, headers=ct, content=b'[1]')).status_code == 204
        assert (await http.post(plain, headers=ct, content=b'[2]')).status_code == 204
        assert (await http.get(encoded, params={"offset": "-1"})).json() == [1]
        assert (await http.get(plain, params={"offset": "-1"})).json() == [2]
        runs = f"{ds_base}/runs%2F{name}"
        assert (await http.put(runs, headers=ct)).status_code == 201
        assert (await http.post(runs, headers=ct, content=b'[3]')).status_code == 204
        assert (await http.get(runs, params={"offset": "-1"})).json() == [3]


async def sse_events(http: httpx.AsyncClient, url: str, params: dict[str, str], until_closed: bool
                     ) -> list[tuple[str, Any]]:
    """(event, parsed data) of an SSE read, up to the first control event saying it is up to
    date (or, with ``until_closed``, to the end of the response)."""
    events: list[tuple[str, Any]] = []
    async with http.stream("GET", url, params=params) as resp:
        assert resp.status_code == 200
        event, data = "", ""
        async for line in resp.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()
            elif line == "" and event:
                events.append((event, json.loads(data)))
                if event == "control" and events[-1][1].get("upToDate") and not until_closed:
                    return events
                event, data = "", ""
    return events


@pytest.mark.node
async def test_the_unpublished_adapters_requests_get_the_answers_it_requires(ds_base: str) -> None:
    # The requests @tanstack/ai-durable-stream's durableStream() makes (its source, TanStack/ai
    # packages/ai-durable-stream/src/durable-stream.ts) and what it checks of each answer; any
    # miss is a DurableStreamError in the adapter.
    url = f"{ds_base}/streams/{quote(unique('runs') + '/run-1', safe='')}"
    producer = {"Content-Type": "application/json", "Producer-Id": "p-1", "Producer-Epoch": "0"}
    recs = [{"v": 1, "seq": i, "chunk": {"type": "CUSTOM", "name": f"c{i}"}} for i in (1, 2, 3)]
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        created = await http.put(url, headers={"Content-Type": "application/json"})
        assert created.is_success and created.headers["stream-next-offset"].strip()
        first = await http.post(url, headers={**producer, "Producer-Seq": "0"}, content=json.dumps(recs[:2]))
        assert first.is_success and first.headers["stream-next-offset"].strip()
        # A resent append (the adapter resends once when the first send failed in transit, and it
        # may have landed): a duplicate, 204. The adapter also requires Stream-Next-Offset on it;
        # baton sends the tail, the reference server none (there the adapter's resend throws
        # "append response missing non-empty Stream-Next-Offset").
        again = await http.post(url, headers={**producer, "Producer-Seq": "0"}, content=json.dumps(recs[:2]))
        assert again.status_code == 204
        tail = again.headers.get("stream-next-offset")
        assert tail == (first.headers["stream-next-offset"] if "/ds" in ds_base else None)
        second = await http.post(url, headers={**producer, "Producer-Seq": "1"}, content=json.dumps(recs[2:]))
        assert second.is_success

        # A live SSE read of the open stream: data events are JSON arrays of the records, then
        # control events with streamNextOffset and (open stream) streamCursor. (baton follows
        # each data event with one; the reference server may send two data events in a row in a
        # catch-up, which the adapter accepts: it needs a control event before the window ends.)
        events = await sse_events(http, url, {"offset": "-1", "live": "sse"}, until_closed=False)
        assert [r for e, d in events if e == "data" for r in d] == recs
        assert events[-1][0] == "control"
        controls = [d for e, d in events if e == "control"]
        assert all(isinstance(c["streamCursor"], str) and c["streamCursor"] for c in controls)
        assert controls[-1]["streamNextOffset"] == second.headers["stream-next-offset"]
        control = controls[-1]

        # The close: a bare POST (no body, no content type) with Stream-Closed: true.
        closed = await http.post(url, headers={"Stream-Closed": "true"})
        assert closed.is_success and closed.headers["stream-next-offset"].strip()
        assert closed.headers["stream-closed"].lower() == "true"

        # A resumed read from the first batch's end (with the cursor): the rest, then a control
        # event with streamClosed, then the response ends.
        events = await sse_events(http, url, {"offset": first.headers["stream-next-offset"], "live": "sse",
                                              "cursor": control["streamCursor"]}, until_closed=True)
        assert [r for e, d in events if e == "data" for r in d] == recs[2:]
        assert events[-1][0] == "control" and events[-1][1]["streamClosed"] is True
