"""Fixtures of the delivery-log tests: a connected log on a unique stream per test."""
from __future__ import annotations

from typing import AsyncIterator, Callable

import nats
import pytest
from nats.aio.client import Client as NATS

from baton.log import DeliveryLog, LogConfig
from baton_tools.testing.servers import NatsServer
from tests.conftest import unique


def unique_cfg(**overrides: object) -> LogConfig:
    """A config naming a stream, prefix and bucket no other test uses."""
    tag = unique("l")
    base = dict(stream=f"RUNS_{tag}", subject_prefix=f"t.{tag}", bucket=f"threads-{tag}")
    base.update(overrides)
    return LogConfig(**base)  # type: ignore[arg-type]


def chunk(i: int, message_id: str = "m1") -> dict[str, object]:
    """A distinct TEXT_MESSAGE_CONTENT chunk number ``i``."""
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": f"d{i}"}


@pytest.fixture
async def nc(nats: NatsServer) -> AsyncIterator[NATS]:
    conn = await _connect(nats.url)
    yield conn
    await conn.close()


async def _connect(url: str) -> NATS:
    return await nats.connect(servers=[url], max_reconnect_attempts=-1, reconnect_time_wait=0.1)


@pytest.fixture
async def dlog(nc: NATS) -> AsyncIterator[DeliveryLog]:
    """A provisioned delivery log on a stream of its own (deleted afterwards)."""
    log = DeliveryLog(nc, unique_cfg())
    await log.provision()
    yield log
    js = nc.jetstream()
    await js.delete_stream(log.cfg.stream)
    await js.delete_key_value(log.cfg.bucket)


@pytest.fixture
def make_cfg() -> Callable[..., LogConfig]:
    return unique_cfg
