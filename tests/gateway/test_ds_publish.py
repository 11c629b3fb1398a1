"""The Durable Streams store's JetStream publisher (one reply subscription, a future per
publish): each publish gets its own ack, each refusal raises JetStream's error, and a publish
is never reported stored without JetStream's ack."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from nats import errors as nats_errors
from nats.js import errors as js_errors
import pytest
from nats.js import api

from baton.log import DeliveryLog
from baton.log._api import ERR_WRONG_LAST_SEQUENCE
from baton_tools.testing.servers import NatsServer
from gateway.durable_streams._publish import Publisher
from tests.conftest import assert_eventually, unique


async def retry_until_acked(publish: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """The ack of ``publish``, asked again while the client is still catching up with the
    restarted server (a publish sent before its reply subscription is back times out)."""
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        try:
            return await publish()
        except nats_errors.TimeoutError:
            if asyncio.get_running_loop().time() > deadline:
                raise


async def test_acks_and_refusals_of_concurrent_publishes(nats: NatsServer) -> None:
    conn = await DeliveryLog.connect(nats.url, no_echo=True)
    try:
        name = unique("PUB").replace("-", "_")
        await conn.js.add_stream(api.StreamConfig(name=name, subjects=[f"{name}.*"]))
        pub = Publisher(conn.nc)
        await pub.start()
        try:
            # Concurrent publishes each get their own ack.
            acks = await asyncio.gather(*(pub.publish(f"{name}.s{i}", b"x%d" % i, 0) for i in range(8)))
            assert sorted(a["seq"] for a in acks) == list(range(1, 9))
            for i, ack in enumerate(acks):
                got = await conn.js.get_msg(name, ack["seq"])
                assert (got.subject, got.data) == (f"{name}.s{i}", b"x%d" % i)
            # JetStream's refusal (an ack carrying an error) raises its class.
            with pytest.raises(js_errors.APIError) as refused:
                await pub.publish(f"{name}.s0", b"late", 0)
            assert refused.value.err_code == ERR_WRONG_LAST_SEQUENCE
            # No stream takes the subject: a reply with a status header (503).
            with pytest.raises(js_errors.NoStreamResponseError):
                await pub.publish(unique("nostream"), b"x", 0)
            # The connection's other subscriptions still get their messages (from another
            # connection: this one is no-echo, as the store's).
            other = await conn.nc.subscribe(f"{name}.watch")
            await conn.nc.flush()
            sender = await DeliveryLog.connect(nats.url)
            try:
                await sender.nc.publish(f"{name}.watch", b"hello")
            finally:
                await sender.close()
            assert (await pub.publish(f"{name}.s9", b"y", 0))["stream"] == name
            assert (await other.next_msg(timeout=5)).data == b"hello"
        finally:
            await pub.stop()
    finally:
        await conn.close()


async def test_a_publish_while_the_server_is_down_is_never_reported_stored(own_nats: NatsServer) -> None:
    conn = await DeliveryLog.connect(own_nats.url, no_echo=True)
    try:
        name = unique("PUB").replace("-", "_")
        await conn.js.add_stream(api.StreamConfig(name=name, subjects=[f"{name}.*"]))
        pub = Publisher(conn.nc, timeout=0.5)
        await pub.start()
        try:
            own_nats.kill()
            with pytest.raises(nats_errors.Error):
                await pub.publish(f"{name}.s", b"x", 0)
            # Back (same port and store): once reconnected, publishes are acked again, through
            # the resubscribed reply subscription.
            own_nats.start()
            await assert_eventually(lambda: conn.nc.is_connected, timeout=20)
            ack = await retry_until_acked(lambda: pub.publish(f"{name}.s", b"y", 0))
            assert (await conn.js.get_msg(name, ack["seq"])).data == b"y"
        finally:
            await pub.stop()
    finally:
        await conn.close()
