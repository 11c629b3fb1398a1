"""Durable Streams served by two gateways at once: each sees the other's writes (its readers
wake, its next write lands after them), and producer dedupe holds whichever gateway a retry
reaches. Each gateway listens for the others' records on its own no-echo NATS connection."""
from __future__ import annotations

import asyncio
import json
from typing import Any

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


async def test_a_read_at_an_offset_the_other_gateway_answered_is_never_sent_back(make_gateway: GatewayFactory,
                                                                               http: httpx.AsyncClient) -> None:
    """A reader holding an offset the other gateway answered (its append, or its read) asks a
    gateway that has not heard of that append yet: it is told that offset, not the end of
    the stale view (from which it would read again what it has)."""
    a, b = await make_gateway(), await make_gateway()
    name = unique("behind")
    on_a, on_b = f"{a.url}/ds/{name}", f"{b.url}/ds/{name}"
    assert (await http.put(on_a, headers=CT, content=b"1")).status_code == 201
    assert (await http.get(on_b, params={"offset": "-1"})).content == b"1"  # b caches the stream
    store_b = b.app.state.durable_streams.handlers.store
    await store_b._sub.unsubscribe()  # b hears no more of a's writes: its view stays behind
    for data in (b"2", b"3"):
        appended = await http.post(on_a, headers=CT, content=data)
        assert appended.status_code == 204
    held = appended.headers["stream-next-offset"]
    read = await http.get(on_a, params={"offset": "-1"})
    assert read.content == b"123" and read.headers["stream-next-offset"] == held

    # An SSE reader at that offset on b is told it, not sent back to b's view's end.
    async with http.stream("GET", on_b, params={"offset": held, "live": "sse"}) as sse:
        assert sse.status_code == 200
        async for line in sse.aiter_lines():
            if line.startswith("data:"):
                control = json.loads(line.removeprefix("data:"))
                break
    assert control["streamNextOffset"] == held and control.get("upToDate") is True

    appended = await http.post(on_a, headers=CT, content=b"4")  # b is behind again
    held = appended.headers["stream-next-offset"]
    caught_up = await http.get(on_b, params={"offset": held})
    assert caught_up.status_code == 200 and caught_up.content == b""
    assert caught_up.headers["stream-next-offset"] == held
    assert caught_up.headers["stream-up-to-date"] == "true"
    # b's view now has the records: a read from the start there is whole.
    whole = await http.get(on_b, params={"offset": "-1"})
    assert whole.content == b"1234" and whole.headers["stream-next-offset"] == held


async def test_a_gateway_whose_nats_connection_dropped_reads_what_the_other_wrote_meanwhile(
        make_gateway: GatewayFactory, http: httpx.AsyncClient) -> None:
    """b's NATS connection drops for a moment while a appends (nothing of it reaches b): once
    reconnected, b's long-poll reader gets a's appends, not a 204 at its timeout."""
    a, b = await make_gateway(), await make_gateway()
    name = unique("blip")
    on_a, on_b = f"{a.url}/ds/{name}", f"{b.url}/ds/{name}"
    assert (await http.put(on_a, headers=CT, content=b"1")).status_code == 201
    first = await http.get(on_b, params={"offset": "-1"})
    assert first.content == b"1"
    store_b = b.app.state.durable_streams.handlers.store
    reconnects = store_b._nc.stats["reconnects"]
    store_b._nc._transport.close()  # a blip: nats-py reconnects on its own
    for data in (b"2", b"3"):
        assert (await http.post(on_a, headers=CT, content=data)).status_code == 204
    await assert_eventually(lambda: store_b._nc.stats["reconnects"] > reconnects and store_b._nc.is_connected)
    poll = await http.get(on_b, params={"offset": first.headers["stream-next-offset"], "live": "long-poll"})
    assert poll.status_code == 200 and poll.content == b"23"


async def test_an_offset_no_gateway_gives_is_answered_from_the_view_without_asking_jetstream(
        make_gateway: GatewayFactory, http: httpx.AsyncClient) -> None:
    """Offsets past the view that are not in the form gateways answer (``9_9``, an overlong
    one) are answered from the view, with no leader read; one in that form is read against
    JetStream (the other gateway may have answered it)."""
    import nats as nats_client

    gw = await make_gateway()
    name = unique("forms")
    url = f"{gw.url}/ds/{name}"
    assert (await http.put(url, headers=CT, content=b"1")).status_code == 201
    tail = (await http.get(url, params={"offset": "-1"})).headers["stream-next-offset"]
    store = gw.app.state.durable_streams.handlers.store
    nc = await nats_client.connect(store._nc.connected_url.geturl())
    reads: list[object] = []
    subject = store.subject(f"/{name}").encode()  # (other tests' streams share the JetStream stream)

    async def count(msg: Any) -> None:
        if subject in msg.data:
            reads.append(msg)

    try:
        await nc.subscribe(f"$JS.API.STREAM.MSG.GET.{store.cfg.stream}", cb=count)
        await nc.flush()
        for offset in ("9_9", "1_0", "9999999999999999999_0"):
            got = await http.get(url, params={"offset": offset})
            assert got.status_code == 200 and got.headers["stream-next-offset"] == tail
        await nc.flush()
        assert reads == []
        got = await http.get(url, params={"offset": "9999999999999999_9999999999999999"})
        assert got.status_code == 200 and got.headers["stream-next-offset"] == tail
        await nc.flush()
        assert len(reads) == 1
    finally:
        await nc.close()
