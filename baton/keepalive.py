"""A session's lease refreshed from a thread of its own, over a channel of its own.

A host's event loop can be busy for seconds (a burst of starts, long replays, a starved
machine): when the lease's refreshes wait for that loop, a host that is only busy loses its
session and its runs are taken over, again and again (docs/operating.md "Overload"). Here
the refreshes run in a daemon thread with a blocking gRPC channel (grpc's synchronous stack,
whose I/O does not go through any asyncio loop), so they keep their pace whatever the loop
does. Only the verdict, "the lease is gone", crosses back to the loop.

The schedule is :class:`baton.coordinator_client.Session`'s: one refresh every TTL/3 on one
``KeepAlive`` stream, counted from the sends; the lease is known to hold until the send time
of the last answered refresh plus the TTL; a replica that leaves a refresh unanswered for two
intervals is left for the next one.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import grpc

from baton import tls as _tls
from baton.internal_auth import TOKEN_METADATA, token_from_env
from baton.v1 import coordinator_pb2 as pb
from baton.v1 import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("baton.keepalive")

__all__ = ["KeepAliveThread"]


class _StreamEnded(Exception):
    pass


class KeepAliveThread:
    """Keeps one session's lease alive from its own thread.

    Args:
        session_id: the lease.
        ttl: its TTL in seconds.
        addresses: the coordinator replicas (``host:port``).
        first: the replica to try first (an index into ``addresses``).
        token: the internal token (``None``: ``BATON_INTERNAL_TOKEN``; ``""``: none).
        tls: the internal links' TLS (``None``: ``BATON_TLS_*``, read here, on the caller's
            thread, so that an unusable file is the caller's error).
        probe_address: returns the address sent with each refresh (read at each send).
        on_lost: called once, from this thread, with why the lease is gone (the lease
            expired, or no refresh was answered for a whole TTL). Never called after
            :meth:`stop`.
        options: channel options.
    """

    def __init__(self, session_id: int, ttl: float, addresses: Sequence[str], *, first: int = 0,
                 token: str | None = None, tls: _tls.GrpcTls | None = None,
                 probe_address: Callable[[], str] = lambda: "", on_lost: Callable[[str], None],
                 options: Sequence[tuple[str, Any]] = ()) -> None:
        self.session_id = session_id
        self.ttl = ttl
        self._addresses = list(addresses)
        self._replica = first
        token = token_from_env() if token is None else token
        self._metadata = [(TOKEN_METADATA, token)] if token else []
        self._tls = _tls.from_env() if tls is None else tls
        self._probe = probe_address
        self._on_lost = on_lost
        self._options = list(options)
        self._stop = threading.Event()
        # Set to send a refresh now (refresh_now), and by a stream's reader when it ends.
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        self._last_ok = time.monotonic()  # send time of the last answered refresh
        self._thread = threading.Thread(target=self._main, name=f"keepalive-{session_id:x}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def refresh_now(self) -> None:
        """Send a refresh at once, out of schedule (the schedule goes on from that send).

        For a probe address set once the process listens: the coordinator arms the session
        for fast failover on the first refresh that carries one, and the next scheduled
        refresh may be a third of the TTL away, a window in which a crash of the process
        would be left to the TTL (docs/design.md §3.2, "Fast failover"). Non-blocking.
        """
        self._wake.set()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop refreshing (the lease then lapses unless revoked) and wait up to ``timeout``
        seconds for the thread. Blocking: call it from a worker thread in async code."""
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # --- the thread -------------------------------------------------------------------

    def _lost(self, why: str) -> None:
        if not self._stop.is_set():
            log.warning("session %x lost: %s", self.session_id, why)
            self._stop.set()
            self._on_lost(why)

    def _main(self) -> None:
        interval = self.ttl / 3
        channels: dict[int, grpc.Channel] = {}
        try:
            while not self._stop.is_set():
                replica = self._replica % len(self._addresses)
                ch = channels.get(replica)
                if ch is None:
                    ch = channels[replica] = _tls.sync_channel(self._addresses[replica], self._options, self._tls)
                try:
                    self._stream(pb_grpc.CoordinatorStub(ch), interval)
                    return  # stopped, or the lease is gone (reported)
                except (grpc.RpcError, _StreamEnded) as exc:
                    self._replica += 1
                    log.info("session %x: keep-alive failed %.1fs after the last answered refresh (%s); reconnecting",
                             self.session_id, time.monotonic() - self._last_ok, exc)
                    if time.monotonic() - self._last_ok >= self.ttl:
                        self._lost(f"no refresh for {self.ttl:.1f}s ({exc})")
                        return
                    self._stop.wait(min(0.1, interval))
        except Exception as exc:  # noqa: BLE001 - a dead keep-alive must say so: the lease goes with it
            log.exception("session %x: keep-alive thread failed", self.session_id)
            self._lost(f"keep-alive thread failed: {exc!r}")
        finally:
            for ch in channels.values():
                ch.close()

    def _stream(self, stub: pb_grpc.CoordinatorStub, interval: float) -> None:
        """One ``KeepAlive`` stream until it fails (raises), the lease is gone or we stop.

        Raises:
            grpc.RpcError, _StreamEnded: the stream broke, or a refresh went unanswered.
        """
        requests: queue.Queue[pb.KeepAliveRequest | None] = queue.Queue()
        sent: collections.deque[float] = collections.deque()
        answered: collections.deque[float] = collections.deque()
        ended = threading.Event()
        verdict: list[str] = []  # "gone", or the error that ended the stream

        def outgoing() -> Iterator[pb.KeepAliveRequest]:
            while True:
                item = requests.get()
                if item is None:
                    return
                yield item

        call = stub.KeepAlive(outgoing(), metadata=self._metadata)
        with self._lock:
            self._call = call

        def read() -> None:
            try:
                for resp in call:
                    at = sent.popleft() if sent else time.monotonic()
                    if resp.ttl_seconds <= 0:
                        verdict.append("gone")
                        return
                    answered.append(at)
                verdict.append("the stream ended")
            except grpc.RpcError as exc:
                verdict.append(f"{exc.code()}: {exc.details()}" if hasattr(exc, "code") else repr(exc))
            finally:
                ended.set()
                self._wake.set()

        reader = threading.Thread(target=read, name=f"keepalive-read-{self.session_id:x}", daemon=True)
        reader.start()
        try:
            while not self._stop.is_set():
                requests.put(pb.KeepAliveRequest(session_id=self.session_id, probe_address=self._probe()))
                sent.append(time.monotonic())
                self._wake.wait(interval)  # the interval, the stream's end, or refresh_now
                self._wake.clear()
                while answered:
                    self._last_ok = max(self._last_ok, answered.popleft())
                if ended.is_set() and not self._stop.is_set():
                    if verdict and verdict[0] == "gone":
                        self._lost("lease gone")
                        return
                    raise _StreamEnded(verdict[0] if verdict else "the stream ended")
                if time.monotonic() - self._last_ok >= self.ttl:
                    raise _StreamEnded(f"no refresh answered for {self.ttl:.1f}s")
                if sent and time.monotonic() - sent[0] >= 2 * interval:
                    raise _StreamEnded(f"a refresh unanswered for {2 * interval:.1f}s")
        finally:
            requests.put(None)
            call.cancel()
            with self._lock:
                self._call = None
            reader.join(1.0)
