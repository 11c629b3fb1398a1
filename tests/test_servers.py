"""The server fixtures themselves: real binaries that can be restarted on the same data."""
from __future__ import annotations

import aetcd
import nats as nats_client

from baton.testing.servers import EtcdServer, NatsServer
from tests.conftest import unique


async def test_etcd_restart_keeps_data(own_etcd: EtcdServer) -> None:
    host, port = own_etcd.endpoint.split(":")
    key = unique("/k").encode()
    async with aetcd.Client(host=host, port=int(port)) as client:
        await client.put(key, b"v1")
    own_etcd.kill()
    own_etcd.start()
    async with aetcd.Client(host=host, port=int(port)) as client:
        got = await client.get(key)
        assert got is not None and got.value == b"v1"


async def test_nats_jetstream_restart_keeps_stream(own_nats: NatsServer) -> None:
    name = unique("S")
    nc = await nats_client.connect(own_nats.url)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    ack = await js.publish(f"{name}.a", b"hello")
    await nc.close()
    own_nats.kill()
    own_nats.start()
    nc = await nats_client.connect(own_nats.url)
    js = nc.jetstream()
    msg = await js.get_msg(name, ack.seq)
    assert msg.data == b"hello"
    await nc.close()
