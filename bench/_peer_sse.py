"""The readers of ``bench/peer_langgraph.py``: one SSE client for both servers.

A reader is an ``httpx`` stream (the same client cost on both sides) that splits the body
into SSE events (``\\n`` or ``\\r\\n`` line ends), keeps the events its side counts (baton's
``TEXT_MESSAGE_CONTENT`` chunks, LangGraph's ``custom`` events) and records, per event, its
index (the first 8 digits of its text, so a gap or a duplicate is seen), its SSE ``id``, its
arrival time (wall clock, s) and the bytes received until then (response head + body).

A body the server gzip-encoded (both sides are asked with httpx's default ``Accept-Encoding:
gzip, deflate``; baton's gateway sends gzip, gateway/_compression.py) is counted as it came
over the wire and inflated here to be split: an event's bytes are then those received up to
the end of the write that brought it.
"""
from __future__ import annotations

import asyncio
import re
import time
import zlib
from typing import Any, Callable

_BOUNDARY = re.compile(rb"\r?\n\r?\n")
_INDEX = re.compile(rb'"delta":\s*"([0-9]{8})(?: ([0-9]+\.[0-9]+) )?')

#: Which SSE events a side counts: ``(event name, data) -> bool``.
Counts = Callable[[str, bytes], bool]


def baton_counts(event: str, data: bytes) -> bool:
    """A baton text chunk (the replay's text deltas; run lifecycle chunks are not counted)."""
    return b'"TEXT_MESSAGE_CONTENT"' in data


def langgraph_counts(event: str, data: bytes) -> bool:
    """A LangGraph ``custom`` event (what the graph's stream writer wrote)."""
    return event == "custom"


class SseReader:
    """One SSE connection; see the module docstring.

    Attributes:
        arrivals: ``[(index, sse id, arrival s since the epoch, sent s or None, bytes up to
            the end of this event (head included))]``
            for every counted event, in arrival order.
        head: the response's status and headers once they came (``None`` before).
        opened: when the request was sent (s since the epoch).
        nbytes: bytes received (status line and headers estimated from the parsed head).
    """

    def __init__(self, http: Any, method: str, url: str, counts: Counts, *, want: int,
                 json_body: Any = None, headers: dict[str, str] | None = None,
                 stop_after: int | None = None) -> None:
        self.http, self.method, self.url, self.counts = http, method, url, counts
        self.json_body, self.headers = json_body, headers or {}
        self.want = want
        self.stop_after = stop_after  # close the connection after this many counted events
        self.arrivals: list[tuple[int, str, float, float | None, int]] = []
        self.head: dict[str, str] | None = None
        self.status = 0
        self.opened = 0.0
        self.nbytes = 0
        self.head_bytes = 0  # the response's status line and headers
        self.body_done = 0  # body bytes up to the end of the last whole event
        self.encoded = False  # the body came gzip-encoded
        self.got_head = asyncio.Event()
        self.head_at = 0.0
        self.seen: set[int] = set()
        self.duplicates = 0

    @property
    def last_id(self) -> str:
        """The SSE id of the last counted event ("" before one came)."""
        return self.arrivals[-1][1] if self.arrivals else ""

    async def run(self) -> None:
        """Read until ``want`` distinct events, ``stop_after`` events, or the stream's end."""
        self.opened = time.time()
        async with self.http.stream(self.method, self.url, json=self.json_body,
                                    headers={"Accept": "text/event-stream", **self.headers}) as resp:
            self.head_at = time.time()
            self.status = resp.status_code
            self.head = dict(resp.headers)
            self.nbytes += len(f"HTTP/1.1 {resp.status_code} {resp.reason_phrase}\r\n") + sum(
                len(k) + len(v) + 4 for k, v in resp.headers.raw) + 2
            self.got_head.set()
            if resp.status_code >= 400:
                await resp.aread()
                raise RuntimeError(f"{self.method} {self.url}: {resp.status_code} {resp.text[:300]}")
            self.head_bytes = self.nbytes
            coding = resp.headers.get("content-encoding", "identity").lower()
            if coding not in ("identity", "gzip"):
                raise RuntimeError(f"{self.url}: a body in {coding}, which this reader does not decode")
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if coding == "gzip" else None
            self.encoded = inflate is not None
            buf = b""
            async for data in resp.aiter_raw():
                now = time.time()
                self.nbytes += len(data)
                if inflate is not None:
                    data = inflate.decompress(data)
                buf += data
                pos = 0
                for m in _BOUNDARY.finditer(buf):
                    raw = buf[pos:m.start()]
                    self.body_done += m.end() - pos
                    pos = m.end()
                    if self._event(raw.replace(b"\r\n", b"\n"), now):
                        return
                buf = buf[pos:]

    def _event(self, raw: bytes, now: float) -> bool:
        """Record one SSE event; True when the reader is done."""
        event, ident, data = "message", "", b""
        for line in raw.split(b"\n"):
            if line.startswith(b"event:"):
                event = line[6:].strip().decode()
            elif line.startswith(b"id:"):
                ident = line[3:].strip().decode()
            elif line.startswith(b"data:"):
                data += line[5:].strip()
        if not self.counts(event, data):
            return False
        m = _INDEX.search(data)
        index = int(m.group(1)) if m else -1
        sent = float(m.group(2)) if m and m.group(2) else None
        if index in self.seen:
            self.duplicates += 1
        self.seen.add(index)
        upto = self.nbytes if self.encoded else self.head_bytes + self.body_done
        self.arrivals.append((index, ident, now, sent, upto))
        if self.stop_after is not None and len(self.arrivals) >= self.stop_after:
            return True
        return len(self.seen) >= self.want


def pct(values: list[float], p: float) -> float | None:
    """The ``p``-th percentile (nearest rank) of ``values``; ``None`` when empty."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]
