"""The gateway's log-health answer never holds an open stream.

An open stream's idle frame used to await the storage probe, which waits up to twice its
timeout while JetStream elects a stream leader: every open stream sat behind it, chunks
that had arrived included. ``peek`` answers at once from the cache and renews it in the
background. The probe here is a stand-in with ``DeliveryLog.probe_storage``'s contract
(it answers after ``delay``, or raises ``LogUnavailable``); the real-server tier is
tests/faults/test_replicated.py (readers' next chunk right after the appends resume).
"""
from __future__ import annotations

import asyncio

import pytest

from baton.errors import LogUnavailable
from gateway._log_health import LogHealth

pytestmark = pytest.mark.unit


class _SlowProbe:
    """``probe_storage`` that takes ``delay`` seconds, then fails when ``failing``."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.failing = False
        self.probes = 0

    async def probe_storage(self, prober: str, *, timeout: float = 2.0) -> None:
        self.probes += 1
        await asyncio.sleep(self.delay)
        if self.failing:
            raise LogUnavailable("RUNS", "JetStream does not answer")


async def test_peek_answers_at_once_and_renews_the_answer_in_the_background() -> None:
    source = _SlowProbe(delay=0.5)
    health = LogHealth(source, "gw-1", ttl=0.0, timeout=2.0)
    source.failing = True
    # peek is a plain function: it cannot wait for the probe it starts.
    assert health.peek() is None  # nothing known yet: no notice
    await asyncio.sleep(0)  # the background probe begins
    assert source.probes == 1
    # The probe in flight is shared: asking again starts no second one.
    assert health.peek() is None and source.probes == 1
    await health.aclose()  # the background probe ends (bounded by its timeout)
    assert isinstance(health.peek(), LogUnavailable)  # what it found, at once
    await health.aclose()
