"""A session whose keep-alive dies of anything but close() reports itself lost.

A stand-in client whose stub raises an error the keep-alive loop does not expect: the
supervision is what is under test, not the coordinator (tests/coordinator covers that).
"""
from __future__ import annotations

import asyncio
import logging

import pytest

from baton.coordinator_client import Session

pytestmark = pytest.mark.unit


class _BrokenClient:
    def __init__(self) -> None:
        self._sessions: set[Session] = set()

    def _stub(self) -> object:
        raise RuntimeError("a bug in the keep-alive")


async def test_an_unexpected_keepalive_error_sets_lost_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="baton.coordinator_client")
    s = Session(_BrokenClient(), 0x1234, ttl=30.0, owner="test")  # type: ignore[arg-type]
    async with asyncio.timeout(5):
        await s.lost.wait()  # long before the 30 s TTL
    assert any("keep-alive failed" in r.getMessage() and r.exc_info for r in caplog.records)
    await s.close()


async def test_a_cancel_not_from_close_sets_lost() -> None:
    class _Idle(_BrokenClient):
        def _stub(self) -> object:
            class _Call:
                async def write(self, _req: object) -> None:
                    await asyncio.Event().wait()

                def cancel(self) -> None:
                    pass

            class _Stub:
                def KeepAlive(self, **_kw: object) -> _Call:  # noqa: N802 (the RPC's name)
                    return _Call()
            return _Stub()

    s = Session(_Idle(), 0x99, ttl=30.0, owner="test")  # type: ignore[arg-type]
    await asyncio.sleep(0)
    s._task.cancel()
    await asyncio.wait({s._task})
    assert s.lost.is_set()
    await s.close()
