"""Server-sent events, client side: one small incremental parser for every reader.

Pure (no I/O): feed it the response's bytes as they arrive and it returns what completed.
It follows the WHATWG HTML "event stream interpretation"
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

- the stream is UTF-8; one leading byte-order mark is dropped;
- lines end with CRLF, LF or CR (a CR at the end of one chunk and an LF at the start of
  the next are one line end);
- a line starting with ``:`` is a comment (the spec ignores it; baton's gateway sends
  ``: keep-alive`` and ``: end``, so comments are returned as :class:`Comment`);
- ``field: value`` (one space after the colon is dropped); a line without a colon is a
  field with an empty value; unknown fields are ignored;
- ``data`` lines are joined with ``\\n``; ``event`` sets the type (default ``message``);
  ``id`` sets the last event id (unless it holds NUL) and persists to later events;
  ``retry`` (ASCII digits only) sets the reconnection time in milliseconds;
- a blank line dispatches the event, unless no ``data`` line was seen (then it only
  resets the type); an event still open when the stream ends is discarded.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import AsyncIterable, AsyncIterator

__all__ = ["Comment", "Event", "SSEParser", "aiter_sse"]


@dataclass(frozen=True)
class Event:
    """One dispatched event.

    Attributes:
        data: the ``data`` lines joined with ``\\n``.
        event: the event type (``message`` unless an ``event`` field said otherwise).
        id: the ``id`` field given in this event's lines, ``None`` when it had none.
        last_event_id: the spec's last event id (persists from earlier events; ``""``
            before any).
    """

    data: str
    event: str = "message"
    id: str | None = None
    last_event_id: str = ""


@dataclass(frozen=True)
class Comment:
    """A comment line, without its ``:`` and one following space (``: end`` → ``end``)."""

    text: str


class SSEParser:
    """Incremental event-stream parser.

    Attributes:
        retry: the reconnection time in milliseconds last set by a ``retry`` field, or
            ``None``.
        last_event_id: the last event id seen (``""`` before any).
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._started = False  # the BOM check is done
        self._skip_lf = False  # the previous chunk ended with CR: a leading LF belongs to it
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self.last_event_id = ""
        self.retry: int | None = None

    def feed(self, chunk: bytes | str) -> list[Event | Comment]:
        """Parse the next part of the stream.

        Args:
            chunk: bytes as received (any split, even inside a UTF-8 sequence or a CRLF),
                or already decoded text.

        Returns:
            The events and comments completed by this chunk, in stream order.
        """
        text = self._decoder.decode(chunk) if isinstance(chunk, bytes) else chunk
        if not self._started:
            if not text:
                return []
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._skip_lf and text:
            self._skip_lf = False
            text = text.removeprefix("\n")
        self._buf += text
        out: list[Event | Comment] = []
        start = 0
        buf = self._buf
        n = len(buf)
        while True:
            cr, lf = buf.find("\r", start), buf.find("\n", start)
            if cr < 0 and lf < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                end, nxt = cr, cr + 1
                if nxt < n:
                    if buf[nxt] == "\n":
                        nxt += 1
                else:
                    self._skip_lf = True  # CR last in this chunk: an LF may follow in the next
            else:
                end, nxt = lf, lf + 1
            item = self._line(buf[start:end])
            if item is not None:
                out.append(item)
            start = nxt
        self._buf = buf[start:]
        return out

    def _line(self, line: str) -> Event | Comment | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return Comment(line[1:].removeprefix(" "))
        name, colon, value = line.partition(":")
        if colon:
            value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\x00" not in value:
                self._id = self.last_event_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self.retry = int(value)
        return None

    def _dispatch(self) -> Event | None:
        data, event, eid = self._data, self._event, self._id
        self._data, self._event, self._id = [], "", None
        if not data:
            return None
        return Event("\n".join(data), event or "message", eid, self.last_event_id)


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[Event | Comment]:
    """Events and comments of a byte stream (e.g. ``httpx.Response.aiter_bytes()``)."""
    parser = SSEParser()
    async for chunk in chunks:
        for item in parser.feed(chunk):
            yield item
