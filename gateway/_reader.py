"""One reader of a run's delivery log: presence, keep-alives, bounded buffering, gap answers.

A reader registers a presence key under the gateway session (docs/design.md §3.3) for as long
as it is connected, so the last reader leaving detaches the run. Chunks flow from the log
read through a bounded queue: a slow client applies backpressure to its own log read and
never grows memory.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable

from ag_ui.core import CustomEvent, EventType

from baton import errors as e
from baton.runs import STREAM_GAP
from gateway._errors import mapping_for
from gateway._fanout import check_offset_kept, stop_read
from gateway._sse import Framing, frame_chunk, frame_end, frame_gap, frame_keepalive, frame_notice
from gateway._state import GatewayState

log = logging.getLogger("gateway.reader")

PRESENCE_TIMEOUT = 3.0  # seconds a presence RPC may take before the reader goes on without it


@dataclass(frozen=True)
class _Gap:
    earliest: str


@dataclass(frozen=True)
class _Failed:
    error: BaseException


@dataclass(frozen=True)
class _End:
    status: str | None  # the log's close status


def gap_chunk(earliest_offset: str) -> dict[str, Any]:
    """``CUSTOM stream.gap {earliestOffset}``: the offset asked for is older than retention."""
    ev = CustomEvent(type=EventType.CUSTOM, name=STREAM_GAP, value={"earliestOffset": earliest_offset})
    return ev.model_dump(by_alias=True, exclude_none=True, mode="json")


async def idle_frame(state: GatewayState, framing: Framing) -> bytes:
    """What an idle stream gets: a keep-alive, or a notice naming why no chunk comes.

    While the delivery log cannot store (issue 19), runs make no progress a reader could
    see; the notice (not log data: no id, no chunk) names the cause, e.g.
    ``LOG_STORAGE_FULL``. The answer is the gateway's cached probe (:mod:`gateway._log_health`),
    taken as it is: a stale probe is renewed in the background, never waited for (chunks
    that arrive meanwhile must not wait behind it).
    """
    problem = state.log_health.peek()
    if problem is None:
        return frame_keepalive(framing)
    m = mapping_for(problem)
    return frame_notice(framing, m.reason if m is not None else "LOG_UNAVAILABLE", str(problem))


async def _pump(source: AsyncIterator[tuple[str, dict[str, Any]]], queue: asyncio.Queue[Any]) -> None:
    try:
        async for item in source:
            await queue.put(item)
        await queue.put(_End(getattr(source, "close_status", None)))
    except e.OffsetExpired as exc:
        await queue.put(_Gap(exc.earliest_offset))
    except e.BatonError as exc:
        await queue.put(_Failed(exc))
    except Exception as exc:  # a bug or a transport failure: end the response, do not hang
        log.exception("reading the delivery log failed")
        await queue.put(_Failed(exc))
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


class Presence:
    """The presence key of one reader, kept under whatever gateway session is current."""

    def __init__(self, state: GatewayState, run_id: str) -> None:
        self._state = state
        self.run_id = run_id
        self.reader_id = f"{state.settings.gateway_id}/{uuid.uuid4().hex}"
        self.session: Any | None = None

    async def ensure(self) -> None:
        """Register under the current session when not registered under it yet (never raises)."""
        session = self._state.session
        if session is None or session is self.session or session.lost.is_set():
            return
        try:
            async with asyncio.timeout(PRESENCE_TIMEOUT):
                await self._state.coordinator.register_reader(self.run_id, session, self.reader_id)
            self.session = session
        except (e.BatonError, TimeoutError) as exc:
            log.warning("presence of reader %s on run %s not registered: %s", self.reader_id, self.run_id, exc)

    async def remove(self) -> None:
        """Unregister, shielded and time-bounded: it must happen even when the reader is cancelled.

        The unregister runs as a task owned by the app state, so when the reader is
        cancelled it finishes on its own and the app still awaits it (at shutdown).
        """
        if self.session is None:
            return
        self.session = None
        task = self._state.spawn(self._unregister(), name=f"unregister-reader:{self.run_id}")
        if task is not None:  # None: shutting down; closing the session removes the key
            await asyncio.shield(task)

    async def _unregister(self) -> None:
        try:
            async with asyncio.timeout(PRESENCE_TIMEOUT):
                await self._state.coordinator.unregister_reader(self.run_id, self.reader_id)
        except (e.BatonError, TimeoutError) as exc:
            log.warning("presence of reader %s on run %s not removed: %s", self.reader_id, self.run_id, exc)


async def stream_log(
    state: GatewayState,
    run_id: str,
    after: str,
    framing: Framing,
    *,
    on_disconnect: Callable[[], Awaitable[None]] | None = None,
    gone: bool = False,
) -> AsyncGenerator[bytes, None]:
    """The framed delivery log of ``run_id`` strictly after ``after``, until it closes.

    Served from the run's shared tail (:mod:`gateway._fanout`) when possible, else from a
    log read of its own. Yields keep-alives every ``settings.keepalive`` seconds while idle,
    or a notice naming the cause while the delivery log cannot store (:func:`idle_frame`).
    An expired offset yields one ``stream.gap`` chunk and ends. When the generator is
    closed before the log closed (the client went away), ``on_disconnect`` runs (e.g.
    cancel a run started with ``detachOnDisconnect: false``). ``gone``: the run is terminal
    and its whole log expired; the reader gets the gap at once (``earliestOffset`` ``-1``).
    """
    if gone:
        yield frame_gap(framing, gap_chunk("-1"), "-1")
        return
    presence = Presence(state, run_id)
    await presence.ensure()
    state.metrics.readers.inc()
    done = [False]
    try:
        if after == "now":
            async for data in _own_read(state, run_id, after, framing, presence, done):
                yield data
            return
        try:
            await check_offset_kept(state.log, run_id, after)
        except e.OffsetExpired as exc:
            done[0] = True
            yield frame_gap(framing, gap_chunk(exc.earliest_offset), exc.earliest_offset)
            return
        except e.BatonError as exc:
            done[0] = True
            log.warning("reader of run %s cannot start: %s", run_id, exc)
            return
        last = int(after) if after != "-1" else 0
        hub = state.hubs.acquire(run_id)
        try:
            while True:
                idx = hub.index_after(last)
                if idx < hub.base:
                    break  # fell behind what the hub keeps: read on our own below
                if idx < hub.end:
                    data, n, nxt = hub.frames(idx, framing)
                    last = hub.seqs[nxt - 1 - hub.base]
                    state.metrics.chunks.inc(n)
                    yield data
                    continue
                if hub.closed:
                    done[0] = True
                    yield frame_end(framing, hub.close_status)
                    return
                if hub.failed is not None:
                    done[0] = True  # not a disconnect: the client reconnects with Last-Event-ID
                    return
                if presence.session is not state.session:
                    await presence.ensure()  # the gateway session was reopened
                if not await hub.changed(state.settings.keepalive):
                    yield await idle_frame(state, framing)
        finally:
            # Bounded (stop_read), so presence removal below is never held up for long.
            await state.hubs.release(hub)
        async for data in _own_read(state, run_id, str(last), framing, presence, done):
            yield data
    finally:
        state.metrics.readers.dec()
        try:
            await presence.remove()
        finally:
            if not done[0] and on_disconnect is not None:
                await on_disconnect()


async def _own_read(state: GatewayState, run_id: str, after: str, framing: Framing, presence: Presence,
                    done: list[bool]) -> AsyncIterator[bytes]:
    """A reader with a log read of its own (``now``, or behind the shared tail's window)."""
    st = state.settings
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=st.reader_queue)
    pump = asyncio.get_running_loop().create_task(_pump(state.log.read(run_id, after=after), queue),
                                                  name=f"reader:{run_id}")
    try:
        while True:
            if queue.empty():
                if presence.session is not state.session:
                    await presence.ensure()  # the gateway session was reopened
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                    # cancellation that races with the result, and a reader whose client
                    # left would then stream on into the void.
                    async with asyncio.timeout(st.keepalive):
                        item = await queue.get()
                except TimeoutError:
                    yield await idle_frame(state, framing)
                    continue
            else:
                item = queue.get_nowait()
            if isinstance(item, _End):
                done[0] = True
                yield frame_end(framing, item.status)
                return
            if isinstance(item, _Gap):
                done[0] = True
                yield frame_gap(framing, gap_chunk(item.earliest), item.earliest)
                return
            if isinstance(item, _Failed):
                # End the response without an end marker: the client reconnects with
                # Last-Event-ID and loses nothing. Not a client disconnect.
                done[0] = True
                log.warning("reader of run %s ends early: %s", run_id, item.error)
                return
            offset, chunk = item
            state.metrics.chunks.inc()
            yield frame_chunk(framing, offset, chunk)
    finally:
        await stop_read(pump)
