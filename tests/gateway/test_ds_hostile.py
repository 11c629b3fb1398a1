"""Hostile input to /ds that once answered 500 (found by the fuzz suite, tests/fuzz): a clear
4xx or a correct answer now, and nothing stored by a refused request."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from baton.sse import Event, aiter_sse
from tests.conftest import unique
from tests.gateway.conftest import Gateway


async def test_a_created_stream_s_location_is_its_path_as_sent(gateway: Gateway, http: httpx.AsyncClient) -> None:
    # The Location header was the decoded path: a 500 (no latin-1 header) for a name holding
    # "%E6%97%A5", after the stream was created; and another stream's URL for "%2F".
    for escaped in ("%E6%97%A5", "a%2Fb", "%ff", "%F0%9F%99%82%2F.."):
        url = f"{gateway.url}/ds/{unique('loc')}/{escaped}"
        r = await http.put(url, headers={"Content-Type": "text/plain"}, content=b"one")
        assert r.status_code == 201, (escaped, r.status_code, r.text)
        assert r.headers["location"] == url
        assert (await http.post(r.headers["location"], headers={"Content-Type": "text/plain"},
                                content=b" two")).status_code == 204
        got = await http.get(url, params={"offset": "-1"})
        assert got.status_code == 200 and got.content == b"one two", (escaped, got.status_code, got.content)


async def test_json_with_a_lone_surrogate_escape_is_a_400(gateway: Gateway, http: httpx.AsyncClient) -> None:
    # "\ud800" parses to a str UTF-8 cannot encode: the store's encode raised (500).
    json_ct = {"Content-Type": "application/json"}
    url = f"{gateway.url}/ds/{unique('sur')}"
    r = await http.put(url, headers=json_ct, content=b'["ok", "\\ud800"]')
    assert r.status_code == 400, (r.status_code, r.text)
    assert (await http.head(url)).status_code == 404  # nothing created
    assert (await http.put(url, headers=json_ct, content=b'["ok"]')).status_code == 201
    for body in (b'"\\udfff"', b'[{"k\\udc00": 1}]', b'["a", "\\ud83d"]'):
        r = await http.post(url, headers=json_ct, content=body)
        assert r.status_code == 400, (body, r.status_code, r.text)
    got = await http.get(url, params={"offset": "-1"})
    assert got.status_code == 200 and got.json() == ["ok"]


@pytest.mark.timeout(60)  # before the fix the event loop spun: only pytest-timeout's signal ended the test
async def test_sse_from_an_offset_past_the_tail_reads_on_from_the_tail(gateway: Gateway, http: httpx.AsyncClient) -> None:
    # The SSE loop went on from an offset past the tail without ever waiting: a busy loop
    # that froze the gateway's event loop (every client, and its session) until killed.
    url = f"{gateway.url}/ds/{unique('past')}"
    r = await http.put(url, headers={"Content-Type": "text/plain"}, content=b"abc")
    tail = r.headers["stream-next-offset"]
    past = f"{0:016d}_{10**15:016d}"
    assert past > tail
    async with asyncio.timeout(30), http.stream("GET", url, params={"offset": past, "live": "sse"}) as resp:
        assert resp.status_code == 200
        events = aiter_sse(resp.aiter_bytes())
        first = await anext(events)
        assert isinstance(first, Event) and first.event == "control"
        assert json.loads(first.data)["streamNextOffset"] == tail
        # The gateway goes on serving while the read waits, and the read gets what comes next.
        assert (await http.get(f"{gateway.url}/healthz")).status_code == 200
        assert (await http.post(url, headers={"Content-Type": "text/plain"}, content=b"d")).status_code == 204
        got = await anext(events)
        assert isinstance(got, Event) and (got.event, got.data) == ("data", "d")
    # A closed stream read from past its tail ends at once, closed.
    assert (await http.post(url, headers={"Stream-Closed": "true"})).status_code == 204
    async with asyncio.timeout(30), http.stream("GET", url, params={"offset": past, "live": "sse"}) as resp:
        controls = [json.loads(e.data) async for e in aiter_sse(resp.aiter_bytes()) if isinstance(e, Event)]
    assert controls[-1].get("streamClosed") is True
