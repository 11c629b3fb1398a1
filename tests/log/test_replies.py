"""Requests whose replies share one subscription (baton.log._replies), against a real
nats-server: each request gets its own reply, silence is a timeout, nobody listening is "no
responders", and a request outstanding at close gives up instead of hanging."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from nats import errors as nats_errors
import pytest
from nats.aio.msg import Msg
from nats.js import api

from baton.log import DeliveryLog
from baton.log._replies import Replies
from baton_tools.testing.servers import NatsServer
from tests.conftest import assert_eventually, unique


@pytest.fixture
async def conn(nats: NatsServer) -> AsyncIterator[DeliveryLog]:
    log = await DeliveryLog.connect(nats.url)
    yield log
    await log.close()


@pytest.fixture
async def replies(conn: DeliveryLog) -> AsyncIterator[Replies]:
    r = Replies(conn.nc)
    yield r
    await r.close()


async def _listener(conn: DeliveryLog, prefix: str) -> tuple[str, Any]:
    """A subject and a subscription that takes its requests and never answers."""
    subject = unique(prefix)
    sub = await conn.nc.subscribe(subject)
    await conn.nc.flush()
    return subject, sub


async def test_concurrent_publishes_each_get_their_own_ack(conn: DeliveryLog, replies: Replies) -> None:
    name = unique("REPLIES").replace("-", "_")
    await conn.js.add_stream(api.StreamConfig(name=name, subjects=[f"{name}.*"]))
    msgs = await asyncio.gather(*(replies.request(f"{name}.s{i}", b"x%d" % i, timeout=5) for i in range(20)))
    acks = [json.loads(m.data) for m in msgs]
    assert sorted(a["seq"] for a in acks) == list(range(1, 21))
    for i, ack in enumerate(acks):  # each ack is the one of its own message
        stored = await conn.js.get_msg(name, ack["seq"])
        assert (stored.subject, stored.data) == (f"{name}.s{i}", b"x%d" % i)


async def test_replies_in_another_order_reach_their_own_requests(conn: DeliveryLog, replies: Replies) -> None:
    subject, sub = await _listener(conn, "backwards")
    asked = [asyncio.ensure_future(replies.request(subject, b"q%d" % i, timeout=10)) for i in range(5)]
    got = [await sub.next_msg(timeout=5) for _ in range(5)]
    for msg in reversed(got):  # answered last first
        await msg.respond(b"re:" + msg.data)
    assert [(await a).data for a in asked] == [b"re:q%d" % i for i in range(5)]


async def test_silence_is_a_timeout_and_nobody_listening_is_no_responders(conn: DeliveryLog, replies: Replies) -> None:
    mute, sub = await _listener(conn, "mute")
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(nats_errors.TimeoutError):
        await replies.request(mute, b"?", timeout=0.3)
    assert 0.3 <= loop.time() - began < 3
    assert (await sub.next_msg(timeout=1)).data == b"?"
    with pytest.raises(nats_errors.NoRespondersError):
        await replies.request(unique("nobody"), b"?", timeout=5)

    # An answer after a timeout is dropped; the next request still gets its own.
    echo = unique("echo")

    async def answer(msg: Msg) -> None:
        await msg.respond(b"re:" + msg.data)

    await conn.nc.subscribe(echo, cb=answer)
    await conn.nc.flush()
    assert (await replies.request(echo, b"one", timeout=5)).data == b"re:one"


async def test_close_fails_a_request_still_waiting(conn: DeliveryLog, replies: Replies) -> None:
    mute, sub = await _listener(conn, "mute")
    waiting = asyncio.ensure_future(replies.request(mute, b"?", timeout=60))
    assert (await sub.next_msg(timeout=5)).data == b"?"  # sent: it waits for its reply
    assert not waiting.done()
    loop = asyncio.get_running_loop()
    began = loop.time()
    await replies.close()
    with pytest.raises(nats_errors.TimeoutError):
        await waiting
    assert loop.time() - began < 5  # at the close, not at its 60 s timeout

    with pytest.raises(nats_errors.ConnectionClosedError):  # closed is closed
        await replies.request(mute, b"after", timeout=5)

    # A request made while a close is under way ends at once too, not at its timeout,
    # and leaves no subscription behind.
    other = Replies(conn.nc)
    first = asyncio.ensure_future(other.request(mute, b"1", timeout=60))
    assert (await sub.next_msg(timeout=5)).data == b"1"
    subscriptions = len(conn.nc._subs)
    began = loop.time()
    closing = asyncio.ensure_future(other.close())
    late = asyncio.ensure_future(other.request(mute, b"2", timeout=60))
    await closing
    with pytest.raises(nats_errors.TimeoutError):
        await first
    with pytest.raises((nats_errors.TimeoutError, nats_errors.ConnectionClosedError)):
        await late
    assert loop.time() - began < 5
    assert len(conn.nc._subs) == subscriptions - 1


async def test_requesters_sharing_a_reply_prefix_each_get_their_own_and_hear_the_others(
        nats: NatsServer) -> None:
    """Two requesters (two connections) under one shared prefix: each request is answered to
    its own requester, whose reply subject carries the tag it gave; each hears the other's
    replies, never its own, once."""
    name = unique("SHARED").replace("-", "_")
    shared = f"_ACKS.{name}"
    logs = [await DeliveryLog.connect(nats.url) for _ in range(2)]
    heard: dict[str, list[Msg]] = {"a": [], "b": []}

    def hearer(who: str) -> Any:
        async def on_other(msg: Msg) -> None:
            heard[who].append(msg)
        return on_other

    a = Replies(logs[0].nc, shared=shared, own="a", on_other=hearer("a"))
    b = Replies(logs[1].nc, shared=shared, own="b", on_other=hearer("b"))
    try:
        await logs[0].js.add_stream(api.StreamConfig(name=name, subjects=[f"{name}.*"]))
        for r in (a, b):
            await r.start()
        for log in logs:
            await log.nc.flush()  # the server has both subscriptions
        got_a = await a.request(f"{name}.x", b"1", timeout=5, tag="k1.7")
        got_b = await b.request(f"{name}.y", b"2", timeout=5, tag="k2.9")
        assert json.loads(got_a.data)["seq"] == 1 and json.loads(got_b.data)["seq"] == 2
        assert got_a.subject == f"{shared}.a.k1.7.0" and got_b.subject == f"{shared}.b.k2.9.0"

        async def both_heard() -> bool:
            assert [m.subject for m in heard["b"]] == [got_a.subject]
            assert [m.subject for m in heard["a"]] == [got_b.subject]
            return True

        await assert_eventually(both_heard, timeout=10)
        with pytest.raises(ValueError):
            await Replies(logs[0].nc).request(f"{name}.x", b"", timeout=1, tag="t")  # no shared prefix
        for bad in ("", "a.b", "a*", "a>"):
            with pytest.raises(ValueError):
                Replies(logs[0].nc, shared=shared, own=bad, on_other=hearer("a"))
        with pytest.raises(ValueError):
            Replies(logs[0].nc, shared=shared, own="c")  # nobody to hand the others' replies to
    finally:
        for r in (a, b):
            await r.close()
        for log in logs:
            await log.close()
