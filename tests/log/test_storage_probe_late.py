"""The storage probe (DeliveryLog.probe_storage) tells a late acknowledgement from a store
that does not store: a probe JetStream stored, whose answer came after the probe's timeout
(the gateway's loop or nats-server starved of CPU), is no storage problem. A real
nats-server behind a TCP proxy that holds the server's answers."""
from __future__ import annotations

import asyncio
from typing import Any

import nats as nats_py
import pytest

from baton.log import DeliveryLog
from baton.log._api import first_on_subject
from baton_tools.testing.proxy import TcpProxy
from baton_tools.testing.servers import NatsServer
from tests.log.conftest import unique_cfg

pytestmark = [pytest.mark.timeout(60), pytest.mark.servers]


async def test_a_probe_stored_but_acknowledged_late_is_no_storage_problem(nats: NatsServer) -> None:
    proxy = await TcpProxy(int(nats.url.rsplit(":", 1)[1])).start()
    cfg = unique_cfg()
    via_proxy = await nats_py.connect(servers=[f"nats://{proxy.endpoint}"], max_reconnect_attempts=-1)
    direct = await nats_py.connect(servers=[nats.url])
    log = DeliveryLog(via_proxy, cfg)
    # The probe's read-back, seen on the server (a JetStream API request is a core subject).
    read_back = asyncio.Event()

    async def saw(_: Any) -> None:
        read_back.set()
    await direct.subscribe(f"$JS.API.STREAM.MSG.GET.{cfg.stream}", cb=saw)
    await direct.flush()
    try:
        await log.provision()
        await log.probe_storage("gw-late")  # answered in time

        proxy.hold("down")  # the server's answers wait in the proxy: the probe's acknowledgement is late
        probe = asyncio.create_task(log.probe_storage("gw-late", timeout=0.5))
        async with asyncio.timeout(10):
            await read_back.wait()  # the acknowledgement did not come in 0.5 s: it reads back
        proxy.hold()  # the late acknowledgement, then the read-back's answer
        await probe  # stored: no LogStorageFull

        # Both probes are in the stream, each with its own nonce: the read-back found this
        # probe's, not the one before it. (A probe that was not stored, with reads answered,
        # stays LOG_STORAGE_FULL: tests/log/test_storage_full.py, a real full disk.)
        subject = f"{cfg.subject_prefix}._probe.gw-late"
        first = await first_on_subject(direct, cfg.stream, subject)
        assert first is not None
        second = await first_on_subject(direct, cfg.stream, subject, start=first.seq + 1)
        assert second is not None and len(second.data) == len(first.data) == 16 and second.data != first.data
        assert await first_on_subject(direct, cfg.stream, subject, start=second.seq + 1) is None
    finally:
        proxy.hold()
        js = direct.jetstream()
        await js.delete_stream(cfg.stream)
        await js.delete_key_value(cfg.bucket)
        await via_proxy.close()
        await direct.close()
        await proxy.close()
