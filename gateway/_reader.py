"""One reader of a run's delivery log, whatever the edge: presence, the shared tail, gap answers.

A :class:`RunRead` is what the run service hands every edge for a join or a start: HTTP
(SSE/NDJSON) and gRPC frame its steps with :func:`stream_log`, ``/ds`` turns them into its
protocol's events. It registers a presence key under the gateway session (docs/design.md
§3.3) for as long as it is open, so the last reader leaving detaches the run. Chunks come
from the run's shared tail (:mod:`gateway._fanout`), or, for ``now`` and for a reader behind
what the tail keeps, from a log read of its own through a bounded queue: a slow client
applies backpressure to its own log read and never grows memory.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Awaitable, Callable, Sequence

from ag_ui.core import CustomEvent, EventType

from baton import errors as e
from baton.aio import drop_task
from baton.retry import Attempts, Deadline
from baton.runs import STREAM_GAP
from gateway._errors import mapping_for
from gateway._fanout import RunHub, check_offset_kept, stop_read
from gateway._presence_batch import PRESENCE_TIMEOUT, BatcherClosed
from gateway._snapshots import ServedSnapshot
from gateway._sse import Framing, chunk_frame, dumps, frame_end, frame_gap, frame_keepalive, frame_notice
from gateway._state import GatewayState

log = logging.getLogger("gateway.reader")

#: Chunks of the shared tail one step takes at most (one write, its drain awaited before the
#: next): what a reader whose client stopped reading holds, as its own log read holds at most
#: one pull batch (``baton.log`` consumers' 256). Without it a reader joining a run the hub
#: keeps whole wrote all of it at once into its transport's buffer (a 20,000-chunk run:
#: 4 MB for every stalled reader; bench/_stalled_slope.py).
STEP_FRAMES = 256


# --- the steps of a read ----------------------------------------------------------------

@dataclass(slots=True)
class Chunks:
    """Chunks ready to send, and the log position after them (their last sequence, or past
    a fence/close the tail read after them). Frame or take them before the next ``await``:
    the shared tail may drop old frames later. Empty: only the position moved."""

    position: int
    hub: RunHub | None = None
    lo: int = 0
    hi: int = 0
    # A tuple default: one Chunks per step of every reader, no empty list made for the shared tail's.
    own: Sequence[tuple[str, dict[str, Any]]] = ()

    def frame(self, framing: Framing) -> bytes:
        """The chunks as one write in ``framing``."""
        if self.hub is not None:
            return self.hub.frames(self.lo, framing, self.hi)[0] if self.hi > self.lo else b""
        return b"".join(chunk_frame(framing, o.encode(), dumps(c)) for o, c in self.own)

    def items(self) -> list[tuple[int, bytes]]:
        """``(stream sequence, chunk JSON bytes)`` of each chunk."""
        if self.hub is not None:
            return self.hub.items(self.lo, self.hi)
        return [(int(o), dumps(c)) for o, c in self.own]

    @property
    def count(self) -> int:
        return self.hi - self.lo if self.hub is not None else len(self.own)


@dataclass(frozen=True)
class End:
    """The log closed: ``status`` of its close record, ``position`` its sequence (0: unknown)."""

    status: str | None
    position: int = 0


@dataclass(frozen=True)
class CaughtUp:
    """A bounded read (``until``) read the log up to its bound; the log goes on."""

    position: int


@dataclass(frozen=True)
class Gap:
    """The offset asked for is older than retention: ``earliest`` offset kept (``-1``: none)."""

    earliest: str


@dataclass(frozen=True)
class Failed:
    """The log read failed: end without an end marker (the client reads again after its last offset)."""

    error: BaseException


@dataclass(frozen=True)
class SnapshotStep:
    """A join from a snapshot: its events stand for every chunk up to its offset; the chunks
    after it follow (gateway/_snapshots.py frames it)."""

    snapshot: ServedSnapshot


Step = Chunks | End | CaughtUp | Gap | Failed | SnapshotStep


def gap_chunk(earliest_offset: str) -> dict[str, Any]:
    """``CUSTOM stream.gap {earliestOffset}``: the offset asked for is older than retention."""
    ev = CustomEvent(type=EventType.CUSTOM, name=STREAM_GAP, value={"earliestOffset": earliest_offset})
    return ev.model_dump(by_alias=True, exclude_none=True, mode="json")


async def idle_frame(state: GatewayState, framing: Framing) -> bytes:
    """What an idle stream gets: a keep-alive, or a notice naming why no chunk comes.

    While the delivery log cannot store, runs make no progress a reader could
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


class Presence:
    """The presence key of one reader, kept under whatever gateway session is current.

    Its calls go through the gateway's :class:`~gateway._presence_batch.PresenceCalls`, with
    the other readers of the run that join or leave meanwhile. Its removal waits for the
    call that carried its registration (the reader may have stopped waiting for it) and is
    tried again while the coordinator does not answer and the key's session lives: a key
    left behind would keep the run attached with no reader, never reaped.
    """

    def __init__(self, state: GatewayState, run_id: str) -> None:
        self._state = state
        self.run_id = run_id
        self.reader_id = f"{state.settings.gateway_id}/{uuid.uuid4().hex}"
        self.session: Any | None = None
        #: The session of the latest registration queued (maybe applied, maybe not): the
        #: key is removed at the end even when its call failed or timed out, as a call
        #: given up on may still land.
        self._sent: Any | None = None
        #: The outcome of the call carrying the latest registration (``PresenceCalls.register``).
        self._call: asyncio.Future[None] | None = None
        self._pending: asyncio.Task[None] | None = None  # a registration under way (start)
        #: :meth:`remove` began: no registration is queued after it (a step of the read still
        #: under way may call :meth:`ensure`; its key would outlive the reader).
        self._closed = False

    def start(self) -> None:
        """Begin registering in the background, on a task the app owns: a reader's first
        chunk does not wait for the RPC (a coordinator call, then an etcd write).
        :meth:`remove` waits for it, so no key is ever left behind a closed reader."""
        session = self._state.session
        if session is None or session.lost.is_set():
            return
        self._pending = self._state.spawn(self._register(), name=f"register-reader:{self.run_id}")

    async def ensure(self) -> None:
        """Register under the current session when not registered under it yet (never raises);
        returns at once while a registration :meth:`start` began is under way."""
        if self._pending is not None and not self._pending.done():
            return
        await self._register()

    async def _register(self) -> None:
        session = self._state.session
        if self._closed or session is None or session is self.session or session.lost.is_set():
            return
        try:
            # Bounded by the call under way for the run and the one carrying this reader,
            # each PRESENCE_TIMEOUT.
            self._call = self._state.presence.register(self.run_id, session.id, self.reader_id)
            self._sent = session
            await asyncio.shield(self._call)
            self.session = session
        except (e.BatonError, TimeoutError, BatcherClosed) as exc:
            # A timeout says nothing by itself (its text is empty): named, with its bound.
            why = (f"no answer within {PRESENCE_TIMEOUT:g} s" if isinstance(exc, TimeoutError)
                   else str(exc) or type(exc).__name__)
            log.warning("presence of reader %s on run %s not registered: %s", self.reader_id, self.run_id, why)

    async def remove(self) -> None:
        """Unregister, shielded: it must happen even when the reader is cancelled.

        The unregister runs as a task owned by the app state, so when the reader is
        cancelled it finishes on its own and the app still awaits it (at shutdown). It
        first waits for a registration still under way and for the call that carried it.
        """
        self._closed = True
        pending, self._pending = self._pending, None
        if pending is not None and pending.done():
            pending = None
        if self._sent is None and pending is None:
            return
        task = self._state.spawn(self._unregister(pending), name=f"unregister-reader:{self.run_id}")
        if task is not None:  # None: shutting down; closing the session removes the key
            await asyncio.shield(task)

    async def _unregister(self, pending: asyncio.Task[None] | None) -> None:
        if pending is not None:
            await asyncio.wait([pending])  # cancelled at shutdown: then the session's close removes the key
        if self._call is not None and not self._call.done():
            # The reader stopped waiting for its registration (it was cancelled): a removal
            # sent before that call lands would delete nothing, and the key would stay.
            await asyncio.wait([self._call])
        session, self._sent, self.session = self._sent, None, None
        if session is None:
            return
        # Tried again while the coordinator does not answer, until the key's session is
        # lost (the key went with its lease) or the gateway shuts down (this is cancelled).
        async for _ in Attempts(Deadline.never(), first_pause=0.2, max_pause=2.0, stop=session.lost):
            try:
                await self._state.presence.unregister(self.run_id, self.reader_id)
                return
            except (e.StoreUnavailable, TimeoutError) as exc:
                log.warning("presence of reader %s on run %s not removed yet: %s", self.reader_id, self.run_id, exc)
            except (e.BatonError, BatcherClosed) as exc:
                log.warning("presence of reader %s on run %s not removed: %s", self.reader_id, self.run_id, exc)
                return


async def _pump(source: Any, queue: asyncio.Queue[Any]) -> None:
    """Feed ``source`` (a ``LogReader``) into ``queue``; every put, the last one included, waits for room."""
    try:
        async for item in source:
            await queue.put(item)
        record = getattr(source, "close_record", None)
        if record is None and getattr(source, "until", None) is not None:
            await queue.put(CaughtUp(source.until))
        else:
            await queue.put(End(getattr(source, "close_status", None), record.offset if record is not None else 0))
    except e.OffsetExpired as exc:
        await queue.put(Gap(exc.earliest_offset))
    except e.BatonError as exc:
        await queue.put(Failed(exc))
    except Exception as exc:  # a bug or a transport failure: end the response, do not hang
        log.exception("reading the delivery log failed")
        await queue.put(Failed(exc))
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


class OffsetCheck:
    """An offset check (:func:`check_offset_kept`) begun early, beside the lookups that decide
    whether the caller may read the run at all (the run's record and tenant: a coordinator
    RPC), so a resume waits for the slower of the two, not for both one after the other.

    Nothing of it reaches the caller before :meth:`take`, which the :class:`RunRead` it is
    handed calls once the caller was shown the run; a check that is not taken (the lookup
    failed, the run is gone) is dropped with :meth:`discard`, its outcome unread. Only a
    decimal offset is checked (``-1`` and ``now`` have nothing to check).

    Raises nothing itself: what the check raises (``OffsetExpired``, ``LogUnavailable``) comes
    out of :meth:`take`.
    """

    def __init__(self, state: GatewayState, run_id: str, after: str) -> None:
        self._log, self._run_id, self._after = state.log, run_id, after
        self._task: asyncio.Task[Any] | None = asyncio.get_running_loop().create_task(
            self._check(state), name=f"offset-check:{run_id}")

    async def _check(self, state: GatewayState) -> Any:
        opened = await check_offset_kept(self._log, self._run_id, self._after)
        if opened is not None and not state.hubs.serving(self._run_id):
            # The read will become the run's new shared tail: its consumer is made (and its
            # first pull sent) while the lookup or the response head is under way. Not
            # beside the check's reads: a consumer create slows the stream's direct gets
            # (measured: the check took 3-9 ms instead of 1-1.5).
            opened.prepare()
        return opened

    async def log_has_records(self) -> bool:
        """Whether the check found the run's log with records in it (an expired offset says so
        too); ``False`` when it did not answer or was dropped. Leaves the answer to :meth:`take`."""
        task = self._task
        if task is None:
            return False
        await asyncio.wait([task])
        if task.cancelled():
            return False
        exc = task.exception()
        if exc is not None:
            return isinstance(exc, e.OffsetExpired)
        opened = task.result()
        return opened is not None and (opened.tail is not None or opened.close_record is not None)

    async def take(self) -> Any:
        """The check's opened log read (as :func:`check_offset_kept` returns it); raises what
        the check raised. A check dropped meanwhile (:meth:`discard`) is made again, now."""
        task, self._task = self._task, None
        if task is None:
            return await check_offset_kept(self._log, self._run_id, self._after)
        return await task

    async def discard(self) -> None:
        """Drop the check (idempotent; never raises): cancel it, or close the read it opened."""
        task, self._task = self._task, None
        if task is not None:
            await drop_task(task, lambda opened: opened.aclose())


class RunRead:
    """The delivery log of ``run_id`` strictly after ``after``, step by step (see :meth:`next`).

    Args:
        state: the gateway state.
        run_id: the run.
        after: ``-1`` (from the start), ``now`` (only what comes next) or a stream sequence.
        on_disconnect: run when the read is closed before the log ended (the client left):
            cancel a run started with ``detachOnDisconnect: false``.
        gone: the run is terminal and its whole log expired: the first step is the gap
            (earliest ``-1``).
        until: a bounded read: it ends with :class:`CaughtUp` once the log was read up to
            this stream sequence (whatever that record's kind), or :class:`End`.
        presence: register a presence key while open (a live reader; a bounded catch-up
            read does not keep a run attached).
        snapshot: a join from a snapshot: its events are the first step (``after`` is the
            offset it covers).
        check: the check of ``after`` begun already (:class:`OffsetCheck`): :meth:`open`
            takes its answer instead of checking again; the read owns it (closes it).

    Use ``async with`` or call :meth:`aclose`: it releases the tail, removes the presence key
    (shielded) and runs ``on_disconnect`` when the read did not reach its end.
    """

    def __init__(self, state: GatewayState, run_id: str, after: str, *,
                 on_disconnect: Callable[[], Awaitable[None]] | None = None, gone: bool = False,
                 until: int | None = None, presence: bool = True, snapshot: ServedSnapshot | None = None,
                 check: OffsetCheck | None = None) -> None:
        self.state = state
        self._check = check
        self.snapshot = snapshot
        self.run_id = run_id
        self.after = after
        self.on_disconnect = on_disconnect
        self.gone = gone
        self.until = until
        self._presence = Presence(state, run_id) if presence else None
        self._opened = False
        self._first: Step | None = None
        self._done = False
        self._closed = False
        self._last = int(after) if after not in ("-1", "now") else 0
        self._told = self._last  # the position last reported
        self._hub: RunHub | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[Any] | None = None
        #: The log's last record as the offset check found it (``None``: empty), once
        #: ``log_tail_read`` (a decimal offset, checked by :meth:`open`).
        self.log_tail: Any = None
        self.log_tail_read = False

    async def open(self) -> Step | None:
        """Begin the presence registration (in the background) and check the offset; start
        the read (idempotent).

        Returns:
            The read's only step when it ends before any chunk: :class:`Gap` (expired offset,
            or ``gone``) or :class:`Failed` (the log did not answer); else ``None``.
        """
        if self._opened:
            return self._first
        self._opened = True
        if self.gone:
            await self._drop_check()
            self._first = Gap("-1")
            return self._first
        self.state.metrics.readers.inc()
        if self._presence is not None:
            # Registered in the background: the presence RPC (coordinator, then etcd) is not
            # on the way to the first chunk; aclose() waits for it before removing the key.
            self._presence.start()
        if self.after == "now":
            self._start_own("now")
            return None
        try:
            await self._check_and_read()
        except e.OffsetExpired as exc:
            self._first = Gap(exc.earliest_offset)
        except e.BatonError as exc:
            log.warning("reader of run %s cannot start: %s", self.run_id, exc)
            self._first = Failed(exc)
        return self._first

    async def _check_and_read(self) -> None:
        """Check the offset, then start the read from the check's opened log read: the run's
        shared tail, or for a snapshot join a read of its own (from the snapshot's offset: the
        shared tail reads a run from its start, and a long run's snapshot join must not wait
        for, or hold, all of it). Raises what the check raises."""
        check, self._check = self._check, None
        if check is not None:
            opened = await check.take()
        else:
            opened = await check_offset_kept(self.state.log, self.run_id, self.after)
        if opened is not None:
            self.log_tail, self.log_tail_read = opened.tail, True
        if self.snapshot is not None:
            self._start_own(self.after, opened)
            return
        hubs = self.state.hubs
        served = hubs.serving(self.run_id)
        self._hub = hubs.acquire(self.run_id, self._last, None if served else opened)
        if served and opened is not None:
            await opened.aclose()  # the run's tail serves this reader: the read is not needed

    async def _drop_check(self) -> None:
        check, self._check = self._check, None
        if check is not None:
            await check.discard()

    def _start_own(self, after: str, opened: Any = None) -> None:
        st = self.state
        source = opened if opened is not None else st.log.read(self.run_id, after=after)
        if self.until is not None:
            source.until = self.until
        self._queue = asyncio.Queue(maxsize=st.settings.reader_queue)
        self._pump_task = asyncio.get_running_loop().create_task(_pump(source, self._queue),
                                                                 name=f"reader:{self.run_id}")

    async def _ensure_presence(self) -> None:
        p = self._presence
        if p is not None and p.session is not self.state.session:
            await p.ensure()  # the gateway session was reopened

    async def next(self, timeout: float) -> Step | None:
        """The next step, waiting up to ``timeout`` seconds for one.

        Returns:
            :class:`Chunks` (more to come), or a last step (:class:`End`, :class:`CaughtUp`,
            :class:`Gap`, :class:`Failed`), or ``None`` when nothing came in time (idle).
        """
        if not self._opened or self._first is not None:  # a step per chunk batch: skip the await once open
            first = await self.open()
            if first is not None:
                self._done = True
                return first
        if self.snapshot is not None:
            snap, self.snapshot = self.snapshot, None
            return SnapshotStep(snap)
        hub = self._hub
        if hub is not None:
            step = await self._from_hub(hub, timeout)
            if step is None or not isinstance(step, bool):
                return step
            # Fell behind what the hub keeps: read on our own from the last chunk served.
            self._hub = None
            await self.state.hubs.release(hub)
            self._start_own(str(self._last))
        return await self._from_own(timeout)

    async def _from_hub(self, hub: RunHub, timeout: float) -> Step | None | bool:
        """A step from the shared tail (``None``: idle); ``False`` when this reader fell
        behind its window."""
        while True:
            # Taken before the hub is looked at: a change while this reader looks, or while
            # it renews its presence below (an RPC), then wakes the wait at once. Taken after
            # that await, it missed such a change and waited out ``timeout`` with the chunks
            # already there.
            since = hub.watch()
            if self._last < hub.dropped_through:
                return False  # frames after our last chunk were dropped: nothing may be skipped
            idx = hub.index_after(self._last)
            stop = min(hub.end if self.until is None else hub.index_after(self.until), idx + STEP_FRAMES)
            if idx < stop:
                self._last = hub.seqs[stop - 1 - hub.base]
                self._told = hub.position if stop == hub.end else self._last
                self.state.metrics.chunks.inc(stop - idx)
                return Chunks(self._told, hub=hub, lo=idx, hi=stop)
            if hub.closed:
                self._done = True
                return End(hub.close_status, hub.close_position)
            if self.until is not None and hub.position >= self.until:
                self._done = True
                return CaughtUp(self.until)
            if hub.failed is not None:
                self._done = True  # not a disconnect: the client reconnects with Last-Event-ID
                return Failed(hub.failed)
            if hub.position > self._told:
                # Only the position moved (a fence was read): say where the log is.
                self._told = hub.position
                return Chunks(self._told, hub=hub, lo=idx, hi=idx)
            p = self._presence
            if p is not None and p.session is not self.state.session:
                await p.ensure()  # the gateway session was reopened (inline: this runs once per wake)
            if not await hub.changed(timeout, since):
                return None

    async def _from_own(self, timeout: float) -> Step | None:
        queue = self._queue
        assert queue is not None
        if queue.empty():
            await self._ensure_presence()
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that races with the result, and a reader whose client left would then
                # stream on into the void.
                async with asyncio.timeout(timeout):
                    item = await queue.get()
            except TimeoutError:
                return None
        else:
            item = queue.get_nowait()
        own: list[tuple[str, dict[str, Any]]] = []
        while isinstance(item, tuple):
            own.append(item)
            if queue.empty():
                item = None
                break
            item = queue.get_nowait()
        if own:
            if item is not None:
                queue.put_nowait(item)  # the last step, after these chunks: room was just made
            self._last = int(own[-1][0])
            self.state.metrics.chunks.inc(len(own))
            return Chunks(self._last, own=own)
        if isinstance(item, Failed):
            log.warning("reader of run %s ends early: %s", self.run_id, item.error)
        self._done = True
        step: Step = item
        return step

    async def aclose(self) -> None:
        """Release what the read holds (idempotent); ``on_disconnect`` if it did not end."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._drop_check()  # begun for a read that was never opened
            if self._hub is not None:
                hub, self._hub = self._hub, None
                # Bounded (stop_read), so presence removal below is never held up for long.
                await self.state.hubs.release(hub)
            if self._pump_task is not None:
                await stop_read(self._pump_task)
        finally:
            if self._opened and not self.gone:
                self.state.metrics.readers.dec()
            try:
                if self._presence is not None:
                    await self._presence.remove()
            finally:
                if self._opened and not self._done and self.on_disconnect is not None:
                    await self.on_disconnect()

    async def __aenter__(self) -> RunRead:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def stream_log(read: RunRead, framing: Framing) -> AsyncGenerator[bytes, None]:
    """The framed log of ``read`` (HTTP SSE/NDJSON, gRPC ``RunEvent`` bytes) until it ends.

    Yields keep-alives every ``settings.keepalive`` seconds while idle, or a notice naming the
    cause while the delivery log cannot store (:func:`idle_frame`). An expired offset yields
    one gap (``stream.gap`` chunk, gRPC ``gap``) and ends; a closed log the end marker; a
    failed read ends without one. The read is always closed (its ``on_disconnect`` runs when
    the generator is closed before the log ended: the client went away).
    """
    state = read.state
    try:
        while True:
            step = await read.next(state.settings.keepalive)
            if step is None:
                yield await idle_frame(state, framing)
            elif isinstance(step, Chunks):
                if step.count:
                    yield step.frame(framing)
            elif isinstance(step, SnapshotStep):
                for piece in step.snapshot.frames(framing):
                    yield piece
            elif isinstance(step, End):
                yield frame_end(framing, step.status)
                return
            elif isinstance(step, Gap):
                yield frame_gap(framing, gap_chunk(step.earliest), step.earliest)
                return
            else:
                return  # Failed (or CaughtUp, which a live read never gets)
    finally:
        await read.aclose()

