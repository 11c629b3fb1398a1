"""While NATS is down every reconnect attempt (5 a second) was logged
with a full traceback by every gateway and host, so an outage of a minute buried the logs
under thousands of lines. An outage is now one warning, one line per attempt (debug) and
one line when the connection is back; the client still reconnects on its own.
"""
from __future__ import annotations

import logging

import pytest

from baton.log import DeliveryLog, LogConfig
from baton_tools.testing.servers import NatsServer
from tests.conftest import assert_eventually, unique


def nats_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.split(".")[0] in ("nats", "baton")]


async def test_a_nats_outage_is_logged_in_lines_not_tracebacks(own_nats: NatsServer,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    name = unique("OUT").upper()
    dlog = await DeliveryLog.connect(own_nats.url, LogConfig(stream=name, subject_prefix=f"{name.lower()}.runs",
                                                            bucket=f"{name.lower()}-threads"))
    try:
        caplog.clear()
        own_nats.kill()

        def attempts() -> int:
            n = sum(1 for r in nats_records(caplog) if r.levelno >= logging.DEBUG and "nats" in r.getMessage().lower())
            assert n >= 4, n  # several failed reconnect attempts were reported
            return n
        await assert_eventually(attempts, timeout=20)
        outage = nats_records(caplog)
        assert [r for r in outage if r.exc_info] == [], "a reconnect attempt was logged with a traceback"
        assert sum(1 for r in outage if r.levelno >= logging.WARNING) == 1, [r.getMessage() for r in outage]

        own_nats.start()
        await assert_eventually(lambda: dlog.nc.is_connected, timeout=20)
        await assert_eventually(lambda: any("reconnected" in r.getMessage() for r in nats_records(caplog)))
    finally:
        await dlog.close()
