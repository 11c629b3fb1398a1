"""Catching a cached stream view up with other gateways' writes, record by record.

Another gateway's write is heard (core NATS) with the sequence it was fenced on, ``prev``
(its ``Nats-Expected-Last-Subject-Sequence``). JetStream stores it only if the subject's
last record is then ``prev``; so once a view has folded a record past ``prev``, that write
is folded already or was refused, and a view whose last sequence is ``prev`` or less lacks
a record that is stored or about to be: this write, or the one stored before it that
refused it. Such a view (``heard_prev >= js_last``) is caught up before it is served, with
direct gets of the subject's next records after its last sequence, in stream order (one
request per record behind), instead of folding the whole stream again. A write is heard of
before JetStream has stored it (the server hands it to subscribers and to the stream's
store side by side), so a record not there yet is waited for briefly; one that never comes
(refused for space, with nothing stored after ``prev``) gives up the view, which is then
folded anew.
"""
from __future__ import annotations

import asyncio
import functools
import json
from typing import Awaitable, Callable

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from gateway.durable_streams import _model as M
from gateway.durable_streams._model import StreamState

EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
WAIT = 0.5  # seconds a catch-up waits for a record heard of to be stored

Fetch = Callable[[int], Awaitable["tuple[int, bytes] | None"]]


def expected_last(msg: Msg) -> int | None:
    """The sequence another gateway's write was fenced on (``None``: it did not say)."""
    raw = (msg.headers or {}).get(EXPECTED_LAST)
    return int(raw) if raw is not None and raw.isdigit() else None


async def next_record(nc: NATS, stream: str, subject: str, start: int) -> tuple[int, bytes] | None:
    """The first stored record of ``subject`` at or after sequence ``start``, by direct get:
    ``(stream sequence, body)``, or ``None`` when there is none.

    Raises:
        nats.js.errors.APIError: JetStream answered with an error other than "no message".
        nats.errors.TimeoutError: no answer within 5 seconds.
    """
    req = json.dumps({"seq": start, "next_by_subj": subject}).encode()
    msg = await nc.request(f"$JS.API.DIRECT.GET.{stream}", req, timeout=5.0)
    headers = msg.headers or {}
    status = headers.get("Status")
    if status is not None and not msg.data:
        if status == "404":
            return None
        raise nats.js.errors.APIError(code=int(status) if status.isdigit() else None,
                                      description=headers.get("Description", ""))
    return int(headers["Nats-Sequence"]), msg.data


async def catch_up(st: StreamState, fetch: Fetch, current: Callable[[], bool], wait: float = WAIT) -> bool:
    """Fold into ``st`` the records after ``st.js_last`` until it is past every write heard of.

    Records at or below ``st.js_last`` when they arrive (this gateway's own write, folded
    while the get was out) are skipped; the view's readers are woken if anything was folded.

    Args:
        st: the cached view (changed in place).
        fetch: the first record at or after a sequence (:func:`next_record` bound to the
            stream's subject).
        current: whether ``st`` is still the cached view (else the catch-up stops).
        wait: seconds to wait for a record heard of to be stored.

    Returns:
        Whether ``st`` is caught up; ``False``: drop it (the records did not come, or the
        stream was deleted, maybe created anew).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    pause = 0.0005
    changed = False
    try:
        while st.heard_prev >= st.js_last:
            rec = await fetch(st.js_last + 1)
            if not current():
                return False
            if rec is None:
                if loop.time() >= deadline:
                    return False
                await asyncio.sleep(pause)  # stored within moments (or what refused it is)
                pause = min(pause * 2, 0.02)
                continue
            seq, body = rec
            if seq <= st.js_last:
                continue
            meta, data = M.decode_record(body)
            if M.apply(st, seq, meta, data) is not st:
                return False
            changed = True
        return True
    finally:
        if changed:
            st.notify()


class CatchUps:
    """The catch-ups in flight, one per stream path whoever asks for it.

    Args:
        nc: the store's NATS connection.
        stream: the JetStream stream holding the streams' subjects.
    """

    def __init__(self, nc: NATS, stream: str) -> None:
        self._nc = nc
        self._stream = stream
        self._tasks: dict[str, asyncio.Task[bool]] = {}

    async def run(self, path: str, subject: str, st: StreamState,
                  cached: Callable[[str], StreamState | None]) -> bool:
        """Catch ``st``, the cached view of ``path`` (``cached(path)``), up (:func:`catch_up`),
        or wait for the catch-up of it already running; whether it is caught up (``False``:
        drop it if still cached). The catch-up runs on if the caller is cancelled."""
        task = self._tasks.get(path)
        if task is None:
            fetch = functools.partial(next_record, self._nc, self._stream, subject)
            task = self._tasks[path] = asyncio.create_task(
                catch_up(st, fetch, lambda: cached(path) is st), name="ds-catch-up")
            task.add_done_callback(functools.partial(self._done, path))
        ok = await asyncio.shield(task)
        return ok or cached(path) is not st

    def _done(self, path: str, task: asyncio.Task[bool]) -> None:
        if self._tasks.get(path) is task:
            del self._tasks[path]
        if not task.cancelled():
            task.exception()  # retrieved: its waiters got it already

    def cancel(self) -> None:
        """Cancel every catch-up (the store stops)."""
        for task in list(self._tasks.values()):
            task.cancel()
