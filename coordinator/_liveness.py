"""Fast failover: revoke a dead process's session when its keep-alive stream breaks.

A host or gateway that crashes (OOM kill, segfault, ``kill -9``, a container restart)
leaves its lease to expire by its TTL, and its runs and readers wait for that. But the
kernel closes a dead process's sockets at once: the coordinator replica holding its
keep-alive stream sees the stream end, and a connect to the address the process
listened on is refused. Both together are definite; only then is the lease revoked, and
the usual failover (the watch on claim deletions, :mod:`coordinator.failover`) and
presence sweeper (:mod:`coordinator._presence`) act right away (docs/design.md §3.2).

grpcio's server reports a reset connection and a client's half-close alike, as the end of
the request stream, so every end the server did not cause (shutdown, an abort) is judged;
the refused connect is what is definite. Everything else keeps the TTL path: a connect
that succeeds (the process is alive, only its stream broke: a network blip, a
client that moved to another replica), a connect that times out or fails otherwise (a
partition, a paused VM), an address that never accepted a connect from here (a wrong
``BATON_HOST_ADVERTISE``), or a stream that is not the session's latest keeper (the
process reconnected its keep-alive to this or another replica meanwhile). Being wrong
costs an unneeded takeover, never a duplicate: the epoch fence stays the safety net.

Each stream, the first time it refreshes a session that names a probe address, *arms*
that session: one connect must succeed (calibration) and the stream writes its token to
``keepers/<lease>`` under the session's lease, only when the lease is a session's (its
``sessions/<lease>`` key is on it: another lease id, the election's, is never armed). Judging a broken stream compares that
key inside the write that removes it, then revokes.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Coroutine

from baton.errors import StoreUnavailable

from coordinator import _etcd as E
from coordinator._store import RunStore
from coordinator.takeovers import CRASH, note_session_end

log = logging.getLogger(__name__)

#: Seconds a probe connect may take; a connect still pending then is not definite. A dead
#: process's port refuses at once (the kernel answers); the time is for a starved
#: coordinator's own loop to see that answer (at 0.5 s a loaded machine judged dead
#: processes "unknown" and left them to the TTL).
PROBE_TIMEOUT = 2.0
#: An arming connect that is not accepted is tried again after these pauses (seconds,
#: doubling), for at most ``ARM_RETRY_WINDOW`` seconds, while the stream lasts: a process
#: opens its session before its server listens (uvicorn runs the app's start-up before it
#: binds), and waiting for the stream's next refresh (a third of the TTL) would leave a
#: process that dies early on the TTL path. After the window, each refresh tries once.
ARM_RETRY_FIRST, ARM_RETRY_MAX, ARM_RETRY_WINDOW = 0.1, 1.0, 30.0
#: A connect accepted right after a stream ended is tried again after these pauses (seconds,
#: doubling) for at most ``RECHECK_WINDOW`` seconds: a process being killed closes its
#: files in order, so its keep-alive connection (opened before it listened) can end while
#: its listening socket still accepts for a moment (longer on a loaded machine: the exit
#: waits for RCU grace periods between files, docs/design.md §3.2). One accepted connect
#: judged that process alive and left its runs to the TTL. A live process keeps accepting
#: and costs only these few connects.
RECHECK_FIRST, RECHECK_MAX, RECHECK_WINDOW = 0.05, 0.5, 3.0


class Verdict(enum.Enum):
    """What a connect to a session's probe address says about its process."""

    GONE = "gone"  # refused: nothing listens there
    ALIVE = "alive"  # accepted
    UNKNOWN = "unknown"  # timed out, unreachable, unresolvable: not definite


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


async def probe(address: str, timeout: float = PROBE_TIMEOUT) -> Verdict:
    """Open and close one TCP connection to ``address`` (``host:port``).

    Returns:
        :attr:`Verdict.GONE` only on ``ECONNREFUSED``; :attr:`Verdict.ALIVE` when the
        connect succeeds; :attr:`Verdict.UNKNOWN` on anything else (timeout, no route,
        a name that does not resolve, a malformed address).
    """
    try:
        host, port = _split(address)
        async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancel on 3.11
            _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return Verdict.GONE
    except (OSError, ValueError, OverflowError, TimeoutError):  # Overflow: a port past 65535
        return Verdict.UNKNOWN
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return Verdict.ALIVE


@dataclass
class StreamKeeper:
    """One KeepAlive stream's view: the sessions it armed, by id → probe address."""

    token: bytes = field(default_factory=lambda: uuid.uuid4().hex.encode())
    armed: dict[int, str] = field(default_factory=dict)
    arming: set[int] = field(default_factory=set)
    ended: bool = False  # the stream is over: stop trying to arm its sessions


class FastFailover:
    """Arms sessions on their keep-alive streams and judges the streams that break.

    Owns its background tasks (:meth:`aclose` cancels and awaits them).

    Args:
        store: the store (its etcd adapter and key layout).
        enabled: ``False`` keeps every session on the TTL path (``BATON_FAST_FAILOVER=0``).
        etcd_timeout: seconds per etcd call.
        probe_timeout: seconds per probe connect.
        recheck_window: seconds a process whose connect was not refused is probed again
            (a dying process's listener can outlive its keep-alive connection briefly).

    Attributes:
        outcomes: counts of judged streams by outcome (``revoked``, ``alive``,
            ``unknown``, ``moved``, ``gone-already``, ``failed``), for tests and benches.
        armed: sessions armed so far (streams × sessions).
    """

    def __init__(self, store: RunStore, *, enabled: bool, etcd_timeout: float,
                 probe_timeout: float = PROBE_TIMEOUT, recheck_window: float = RECHECK_WINDOW) -> None:
        self.store = store
        self.enabled = enabled
        self.etcd_timeout = etcd_timeout
        self.probe_timeout = probe_timeout
        self.recheck_window = recheck_window
        self.outcomes: Counter[str] = Counter()
        self.armed = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def refreshed(self, stream: StreamKeeper, session_id: int, probe_address: str) -> None:
        """A request of ``stream`` refreshed ``session_id``: arm it once (in the background)."""
        if (not self.enabled or not probe_address or session_id in stream.armed
                or session_id in stream.arming):
            return
        stream.arming.add(session_id)
        self._spawn(self._arm(stream, session_id, probe_address), f"arm-session-{session_id:x}")

    async def _arm(self, stream: StreamKeeper, session_id: int, address: str) -> None:
        try:
            loop = asyncio.get_running_loop()
            give_up, pause = loop.time() + ARM_RETRY_WINDOW, ARM_RETRY_FIRST
            while await probe(address, self.probe_timeout) is not Verdict.ALIVE:
                # Not reachable from here (yet): a refusal later would prove nothing. Tried
                # again shortly (the process may not listen yet), then at each refresh.
                if stream.ended or loop.time() + pause > give_up:
                    return
                await asyncio.sleep(pause)
                pause = min(2 * pause, ARM_RETRY_MAX)
                if stream.ended:
                    return
            # Only a session's lease (its sessions/<lease> key is on it): a keep-alive naming
            # another lease id (the election's, a cancel intent's) must not get it revoked.
            k = self.store.keys
            txn = await self.store.etcd.txn([E.cmp_lease(k.session(session_id), session_id)],
                                            [E.put(k.keeper(session_id), stream.token, session_id)],
                                            timeout=self.etcd_timeout)
            if not txn.succeeded:
                log.debug("lease %x is not a session: not armed for fast failover", session_id)
                return
            stream.armed[session_id] = address
            self.armed += 1
        except (StoreUnavailable, E.LeaseNotFound) as exc:
            log.debug("session %x not armed for fast failover: %s", session_id, exc)
        finally:
            stream.arming.discard(session_id)

    def broken(self, stream: StreamKeeper) -> None:
        """``stream`` ended by the client's side: judge each session it armed (in the background)."""
        for session_id, address in stream.armed.items():
            self._spawn(self.judge(stream.token, session_id, address), f"judge-session-{session_id:x}")

    async def judge(self, token: bytes, session_id: int, address: str) -> None:
        """Revoke ``session_id`` when its process is definitely gone (see module docstring)."""
        verdict, probes = await self._settle(address)
        if verdict is not Verdict.GONE:
            self.outcomes[verdict.value] += 1
            log.info("session %x: keep-alive stream broke, %s is %s: the TTL decides",
                     session_id, address, verdict.value)
            return
        key = self.store.keys.keeper(session_id)
        try:
            # Still this stream's session? A keep-alive reconnected to any replica since
            # has written its own token; then the process is not gone after all.
            txn = await self.store.etcd.txn([E.cmp_value(key, token)], [E.delete(key)],
                                            timeout=self.etcd_timeout)
            if not txn.succeeded:
                self.outcomes["moved"] += 1
                log.info("session %x: keep-alive moved to another stream; not revoked", session_id)
                return
            # Why its claims go, for the takeovers they cause (coordinator/takeovers.py).
            await note_session_end(self.store.etcd, self.store.keys, session_id, CRASH, timeout=self.etcd_timeout)
            await self.store.etcd.revoke(session_id, timeout=self.etcd_timeout)
        except E.LeaseNotFound:
            self.outcomes["gone-already"] += 1
            return
        except StoreUnavailable as exc:
            self.outcomes["failed"] += 1
            log.warning("session %x: fast failover failed (%s); the TTL decides", session_id, exc)
            return
        self.outcomes["revoked"] += 1
        if probes > 1:
            self.outcomes["revoked-after-recheck"] += 1
        log.warning("session %x: keep-alive stream ended and %s refuses connections (probe %d): "
                    "lease revoked (fast failover)", session_id, address, probes)

    async def _settle(self, address: str) -> tuple[Verdict, int]:
        """Probe ``address`` until it refuses, or for :attr:`recheck_window` seconds.

        Returns:
            ``(GONE, probes)`` at the first refusal; else the last verdict and the number
            of probes made.
        """
        loop = asyncio.get_running_loop()
        until, pause, probes = loop.time() + self.recheck_window, RECHECK_FIRST, 0
        while True:
            verdict = await probe(address, self.probe_timeout)
            probes += 1
            if verdict is Verdict.GONE or loop.time() + pause > until:
                return verdict, probes
            await asyncio.sleep(pause)
            pause = min(2 * pause, RECHECK_MAX)

    async def aclose(self) -> None:
        """Cancel and await every arming and judging task. Idempotent."""
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)
