"""Durable Streams served by two gateways at once: each sees the other's writes (its readers
wake, its next write lands after them), and producer dedupe holds whichever gateway a retry
reaches. Each gateway listens for the others' records on its own no-echo NATS connection."""
from __future__ import annotations

import asyncio

import httpx

from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, GatewayFactory

CT = {"content-type": "text/plain"}


def readers_waiting(gw: Gateway, name: str) -> bool:
    """Whether a long-poll on ``/ds/<name>`` is parked on ``gw`` (so a wake-up is what answers it)."""
    st = gw.app.state.durable_streams.handlers.store._cache.get(f"/{name}")
    return st is not None and bool(st.changed._waiters)


async def test_two_gateways_share_streams_writes_reads_and_producers(make_gateway: GatewayFactory,
                                                                   http: httpx.AsyncClient) -> None:
    a, b = await make_gateway(), await make_gateway()
    name = unique("shared")
    on_a, on_b = f"{a.url}/ds/{name}", f"{b.url}/ds/{name}"
    assert (await http.put(on_a, headers=CT, content=b"1")).status_code == 201
    first = await http.get(on_b, params={"offset": "-1"})  # b now holds the stream in its cache
    assert first.content == b"1"
    tail = first.headers["stream-next-offset"]

    # A long-poll on b wakes with a's append.
    poll = asyncio.create_task(http.get(on_b, params={"offset": tail, "live": "long-poll"}))
    await assert_eventually(lambda: readers_waiting(b, name))
    appended = await http.post(on_a, headers=CT, content=b"2")
    assert appended.status_code == 204
    got = await poll
    assert got.status_code == 200 and got.content == b"2"
    assert got.headers["stream-next-offset"] == appended.headers["stream-next-offset"]

    # Writes alternate between the gateways and land in order, each after the other's.
    for i, gw in enumerate((a, b, a, b), start=3):
        r = await http.post(f"{gw.url}/ds/{name}", headers=CT, content=str(i).encode())
        assert r.status_code == 204
    for url in (on_a, on_b):
        assert (await http.get(url, params={"offset": "-1"})).content == b"123456"

    # An idempotent producer's retry reaching the other gateway is a duplicate, not a second append.
    p = {**CT, "producer-id": "p", "producer-epoch": "0"}
    assert (await http.post(on_a, headers={**p, "producer-seq": "0"}, content=b"7")).status_code == 200
    dup = await http.post(on_b, headers={**p, "producer-seq": "0"}, content=b"7")
    assert dup.status_code == 204 and dup.headers["producer-seq"] == "0"
    assert (await http.post(on_b, headers={**p, "producer-seq": "1"}, content=b"8")).status_code == 200
    gap = await http.post(on_a, headers={**p, "producer-seq": "3"}, content=b"9")
    assert gap.status_code == 409 and gap.headers["producer-expected-seq"] == "2"
    # An unknown method is refused by the protocol's app, as before it was served directly.
    assert (await http.request("PATCH", on_a, content=b"x")).status_code == 405
    for url in (on_a, on_b):
        assert (await http.get(url, params={"offset": "-1"})).content == b"12345678"
