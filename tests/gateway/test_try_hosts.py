"""The gateway's host order for a start (:func:`gateway._hosts.try_hosts`): which refusals
move on to the next host and which end the start. Server-free: the attempts are functions."""
from __future__ import annotations

from typing import Awaitable, Callable

import pytest

from baton import errors as e
from baton.v1 import coordinator_pb2
from gateway._errors import NoHostAvailable
from gateway._hosts import HostPool, try_hosts

HOSTS = [coordinator_pb2.HostInfo(host_id=h, address=f"{h}:1", capacity=4) for h in ("a", "b")]


def _attempts(answers: dict[str, BaseException | str]
              ) -> tuple[list[str], Callable[[coordinator_pb2.HostInfo], Awaitable[str]]]:
    tried: list[str] = []

    async def attempt(h: coordinator_pb2.HostInfo) -> str:
        tried.append(h.host_id)
        answer = answers[h.host_id]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return tried, attempt


async def test_a_claim_lost_mid_start_moves_on_to_the_next_host() -> None:
    tried, attempt = _attempts({"a": e.RunClaimLost("r", 1, "claim-gone"), "b": "started on b"})
    host, out = await try_hosts(HostPool(None), HOSTS, attempt, next_on=(e.RunClaimLost,))
    assert (tried, host.host_id, out) == (["a", "b"], "b", "started on b")


async def test_a_claim_lost_on_every_host_is_the_answer() -> None:
    lost = e.RunClaimLost("r", 1, "claim-gone")
    tried, attempt = _attempts({"a": lost, "b": e.RunClaimLost("r", 2, "claim-gone")})
    with pytest.raises(e.RunClaimLost) as info:
        await try_hosts(HostPool(None), HOSTS, attempt, next_on=(e.RunClaimLost,))
    assert tried == ["a", "b"] and info.value.held_epoch == 2


async def test_without_next_on_a_claim_lost_ends_the_start_and_a_busy_thread_always_does() -> None:
    tried, attempt = _attempts({"a": e.RunClaimLost("r", 1, "claim-gone"), "b": "started on b"})
    with pytest.raises(e.RunClaimLost):
        await try_hosts(HostPool(None), HOSTS, attempt)
    tried2, attempt2 = _attempts({"a": e.ThreadBusy("t", "other"), "b": "started on b"})
    with pytest.raises(e.ThreadBusy):
        await try_hosts(HostPool(None), HOSTS, attempt2, next_on=(e.RunClaimLost,))
    assert tried == tried2 == ["a"]


async def test_unreachable_everywhere_is_no_host_available() -> None:
    tried, attempt = _attempts({"a": e.StoreUnavailable("down"), "b": e.HostDraining("draining")})
    with pytest.raises(NoHostAvailable):
        await try_hosts(HostPool(None), HOSTS, attempt, next_on=(e.RunClaimLost,))
    assert tried == ["a", "b"]
