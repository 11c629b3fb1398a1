"""One shared tail per run: every reader of a run in this gateway is served from memory.

Without it, each reader would hold its own JetStream consumer and decode every chunk
itself: 1,000 readers of one run cost 1,000 copies of each message from NATS. A
:class:`RunHub` reads the run's log once (from the start), frames each chunk once, and
readers walk its in-order frame list from their own offset, taking every frame that is
already there in one write. The hub lives while it has readers, and for ``linger`` seconds
after the last one left: a reader that comes back within it (a page reload, an SSE
reconnect with ``Last-Event-ID``) is served from memory, with no JetStream consumer made
for it and none deleted behind the one that left. It keeps at most ``max_frames`` frames (a
reader that falls behind the oldest kept frame goes back to a reader of its own, so memory
stays bounded and nothing is skipped).
"""
from __future__ import annotations

import asyncio
import bisect
import json
import logging
from typing import Any

from baton.aio import cancel_and_join
from baton.errors import DeliveryLogError
from gateway._sse import Framing, chunk_frame, dumps

log = logging.getLogger("gateway.fanout")

MAX_FRAMES = 20_000

#: Seconds a run's tail stays after its last reader left (``BATON_TAIL_LINGER``): longer
#: than a browser's ``EventSource`` waits before it reconnects (about 3 s).
TAIL_LINGER = 10.0

#: Seconds a reader's cleanup waits for its log read to end before leaving it (logged): a
#: read that ignores cancellation must not hold up the reader's presence removal.
STOP_PATIENCE = 10.0


async def stop_read(task: asyncio.Task[Any]) -> None:
    """Cancel a log-read task and wait for it, for at most :data:`STOP_PATIENCE` seconds."""
    await cancel_and_join(task, patience=STOP_PATIENCE, every=0.05)


class RunHub:
    """The shared tail of one run's delivery log.

    Attributes:
        seqs: stream sequences of the kept frames, ascending.
        base: how many frames were dropped from the front (indexes are absolute).
        dropped_through: the stream sequence of the newest dropped frame, 0 before any drop
            (a reader whose last chunk is older missed frames the hub no longer keeps).
        closed: the log ended with its close record.
        close_position: the close record's stream sequence once ``closed``.
        position: the stream sequence of the last record read, whatever its kind (a fence
            after the newest chunk counts); before the first, the offset the tail opened at
            (0: the run's start).
        failed: the read failed (readers end; clients reconnect with Last-Event-ID).
    """

    def __init__(self, run_id: str, delivery_log: Any, max_frames: int = MAX_FRAMES, after: int = 0,
                 opened: Any = None) -> None:
        self.run_id = run_id
        # A log read strictly after ``after`` that was opened already (check_offset_kept):
        # the tail starts from it instead of looking the offset up again.
        self._opened = opened
        # A tail opened for a reader that resumes at ``after`` reads from there, not from the
        # run's start (a reconnect must not wait for the whole log to be read again): the
        # records up to ``after`` count as dropped, so an older reader reads on its own.
        self._after = after
        self._log = delivery_log
        self._max = max_frames
        self.seqs: list[int] = []
        self.offsets: list[str] = []
        self.payloads: list[bytes] = []
        # gRPC frames (RunEvent.chunks entries), built once per chunk when a gRPC reader
        # first needs them, aligned with ``seqs`` from ``base`` (may be shorter).
        self._grpc: list[bytes] = []
        self.base = 0
        self.dropped_through = after
        self.closed = False
        self.close_status: str | None = None
        self.close_position = 0
        self.position = after  # the log is known up to the reader's offset
        self.failed: BaseException | None = None
        self.readers = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tail(), name=f"hub:{self.run_id}")

    async def _tail(self) -> None:
        reader, self._opened = self._opened, None
        if reader is None:
            reader = self._log.read(self.run_id, after=str(self._after) if self._after > 0 else "-1")
        reader.on_marker = self._marker
        # Each chunk's stored bytes as they are: the writer encoded them as every framing
        # carries a chunk (gateway._sse.dumps), so decoding and encoding again would give
        # the same bytes. Bytes with a line break (not the writer's) go through the codec.
        reader.raw = True
        try:
            async for offset, data in reader:
                self.position = seq = int(offset)
                self.seqs.append(seq)
                self.offsets.append(offset)
                self.payloads.append(data if b"\n" not in data and b"\r" not in data else dumps(json.loads(data)))
                if len(self.seqs) > self._max:
                    drop = len(self.seqs) - self._max
                    self.dropped_through = self.seqs[drop - 1]
                    del self.seqs[:drop], self.offsets[:drop], self.payloads[:drop], self._grpc[:drop]
                    self.base += drop
                self._notify()
            self.close_status = getattr(reader, "close_status", None)
            record = getattr(reader, "close_record", None)
            self.close_position = record.offset if record is not None else self.position
            self.closed = True
        except asyncio.CancelledError:
            raise
        except DeliveryLogError as exc:  # LogUnavailable and the like: readers end, clients reconnect
            log.warning("shared tail of run %s failed: %s", self.run_id, exc)
            self.failed = exc
        except Exception as exc:  # a bug: same, but with its traceback
            log.exception("shared tail of run %s failed", self.run_id)
            self.failed = exc
        finally:
            self._notify()
            await reader.aclose()

    def _marker(self, seq: int) -> None:
        # A fence or the close: no frame, but the position moved (a catch-up read up to a
        # tail that is a fence waits for it).
        self.position = seq
        self._notify()

    def _notify(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    @property
    def end(self) -> int:
        """Absolute index one past the newest frame."""
        return self.base + len(self.seqs)

    def index_after(self, seq: int) -> int:
        """Absolute index of the first frame with a sequence greater than ``seq``."""
        return self.base + bisect.bisect_right(self.seqs, seq)

    def frames(self, start: int, framing: Framing, stop: int | None = None) -> tuple[bytes, int, int]:
        """Every kept frame from absolute index ``start`` (to ``stop``, exclusive, or the
        newest), joined, for one write.

        Returns:
            ``(bytes, count, next_index)``. Raises ``IndexError`` when ``start`` was dropped.
        """
        if start < self.base:
            raise IndexError(start)
        lo, hi = start - self.base, len(self.seqs) if stop is None else min(stop - self.base, len(self.seqs))
        if framing == "grpc":
            g = self._grpc
            if len(g) < hi:
                g.extend(chunk_frame("grpc", self.offsets[i].encode(), self.payloads[i]) for i in range(len(g), hi))
            parts = g[lo:hi]
        else:
            offsets, payloads = self.offsets, self.payloads
            parts = [chunk_frame(framing, offsets[i].encode(), payloads[i]) for i in range(lo, hi)]
        return b"".join(parts), hi - lo, self.base + hi

    def items(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        """``(stream sequence, chunk JSON bytes)`` of the kept frames in ``[start, stop)``
        (absolute indexes; ``start`` must still be kept)."""
        lo, hi = start - self.base, stop - self.base
        return list(zip(self.seqs[lo:hi], self.payloads[lo:hi]))

    def watch(self) -> asyncio.Event:
        """The event the next change sets: take it *before* looking at the hub, then wait
        with ``changed(timeout, since=...)``, so a change made while the caller looked (or
        awaited something else in between) wakes it at once instead of being missed."""
        return self._changed

    async def changed(self, timeout: float, since: asyncio.Event | None = None) -> bool:
        """Wait until new frames arrive or the hub ends; ``False`` on timeout.

        Args:
            timeout: seconds to wait at most.
            since: an event from :meth:`watch`: any change after it was taken counts
                (without it, only a change after this call does).
        """
        ev = self._changed if since is None else since
        try:
            async with asyncio.timeout(timeout):
                await ev.wait()
            return True
        except TimeoutError:
            return False

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_read(self._task)
        opened, self._opened = self._opened, None
        if opened is not None:  # the tail was stopped before it began: close the read it was given
            await opened.aclose()


class Hubs:
    """The hubs of one gateway, one per run with readers or lingering (owned by the app state).

    Args:
        delivery_log: the ``baton.log.DeliveryLog`` the tails read.
        max_frames: frames each tail keeps at most.
        linger: seconds a tail stays after its last reader left (0: it goes at once). A
            tail whose read failed never lingers, and one that cannot serve the reader who
            comes (failed since, or opened after the reader's offset, or dropped frames
            past it) is replaced: a reader that comes back reads again. After
            :meth:`aclose` no tail lingers.
    """

    def __init__(self, delivery_log: Any, max_frames: int = MAX_FRAMES, linger: float = TAIL_LINGER) -> None:
        self._log = delivery_log
        self._max = max_frames
        self._linger = linger
        self._hubs: dict[str, RunHub] = {}
        # The lingering tails' ends, by run id.
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        # Lingering tails being closed (their read's consumer deleted).
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    def acquire(self, run_id: str, after: int = 0, opened: Any = None) -> RunHub:
        """The run's shared tail, one more reader on it; a new tail reads the log strictly
        after ``after`` (a stream sequence; 0: from the start), from ``opened`` when given
        (a log read strictly after ``after``, opened but not iterated; the caller closes it
        when the run has a tail already: :meth:`serving`)."""
        hub = self._hubs.get(run_id)
        if hub is not None and hub.readers == 0 and (hub.failed is not None or after < hub.dropped_through):
            # A lingering tail this reader cannot use (its read failed since; or it began
            # after the reader's offset, or dropped frames past it): joined, it would send
            # the reader to a read of its own and linger on. A new tail from its offset.
            self._drop(hub)
            hub = None
        if hub is None:
            hub = self._hubs[run_id] = RunHub(run_id, self._log, self._max, after, opened)
            hub.start()
        timer = self._expiry.pop(run_id, None)
        if timer is not None:
            timer.cancel()  # a reader came back: the tail stays
        hub.readers += 1
        return hub

    def serving(self, run_id: str) -> bool:
        """Whether the run has a shared tail here, with readers or lingering (a new reader of
        it joins that tail)."""
        return run_id in self._hubs

    def readers_per_run(self) -> list[int]:
        """Readers of each run with readers (a copy: safe to call from the scrape's thread)."""
        return [n for n in (h.readers for h in list(self._hubs.values())) if n]

    async def release(self, hub: RunHub) -> None:
        """One reader less on ``hub``; after the last, the tail lingers (or goes at once
        when ``linger`` is 0 or its read failed)."""
        if hub.readers <= 0:
            return  # released already
        hub.readers -= 1
        if hub.readers > 0 or self._hubs.get(hub.run_id) is not hub:
            return
        if self._linger > 0 and hub.failed is None and not self._closed:
            # No timer is armed for it here: the acquire that made it 1 reader disarmed it.
            self._expiry[hub.run_id] = asyncio.get_running_loop().call_later(self._linger, self._expire, hub)
            return
        del self._hubs[hub.run_id]
        await hub.aclose()

    def _expire(self, hub: RunHub) -> None:
        self._expiry.pop(hub.run_id, None)
        if hub.readers == 0 and self._hubs.get(hub.run_id) is hub:
            self._drop(hub)

    def _drop(self, hub: RunHub) -> None:
        """Forget ``hub`` and close it in the background (its read's consumer is deleted)."""
        del self._hubs[hub.run_id]
        task = asyncio.get_running_loop().create_task(hub.aclose(), name=f"hub-close:{hub.run_id}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        self._closed = True
        for timer in self._expiry.values():
            timer.cancel()
        self._expiry.clear()
        hubs, self._hubs = list(self._hubs.values()), {}
        for h in hubs:
            await h.aclose()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


async def check_offset_kept(delivery_log: Any, run_id: str, after: str) -> Any:
    """Raise ``OffsetExpired`` when ``after`` is older than what retention kept.

    Returns:
        For a decimal offset, the opened log read (its start resolved, no consumer created
        yet; one not used is closed, as :meth:`LogReader.prepare` may have begun its
        consumer): :meth:`Hubs.acquire` starts a new tail from it, so a resume looks its
        offset up once, not here and again in the tail. ``None`` for ``-1`` and ``now``
        (nothing to check).
    """
    if after in ("-1", "now"):
        return None
    reader = delivery_log.read(run_id, after=after)
    try:
        await reader.open()
    except BaseException:
        await reader.aclose()
        raise
    return reader
