"""The Durable Streams protocol's pure rules: header names, offsets, validation, JSON mode, cursors.

No I/O here: the store (``_store.py``) and the routes (``_routes.py``) call these. Offsets
are ``<16 digits>_<16 digits>``: a read sequence (always 0 for our own streams) and the byte
position after a message, counting a 5-byte frame per message as the reference server
does, so offsets are opaque, strictly increasing, and compare correctly as strings.
"""
from __future__ import annotations

import json
import operator
import random
import re
import time
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate, count
from typing import Any
from urllib.parse import unquote

# Header names (PROTOCOL.md §5).
NEXT_OFFSET = "Stream-Next-Offset"
CURSOR = "Stream-Cursor"
UP_TO_DATE = "Stream-Up-To-Date"
CLOSED = "Stream-Closed"
TTL = "Stream-TTL"
EXPIRES_AT = "Stream-Expires-At"
SEQ = "Stream-Seq"
PRODUCER_ID = "Producer-Id"
PRODUCER_EPOCH = "Producer-Epoch"
PRODUCER_SEQ = "Producer-Seq"
PRODUCER_EXPECTED_SEQ = "Producer-Expected-Seq"
PRODUCER_RECEIVED_SEQ = "Producer-Received-Seq"
FORKED_FROM = "Stream-Forked-From"
FORK_OFFSET = "Stream-Fork-Offset"
FORK_SUB_OFFSET = "Stream-Fork-Sub-Offset"
SSE_DATA_ENCODING = "Stream-SSE-Data-Encoding"

# Sent on every response: what a browser checks on an actual (non-preflight) response.
CORS_HEADERS = {
    "access-control-allow-origin": "*",
    "access-control-expose-headers": (
        "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Producer-Epoch, "
        "Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, etag, content-type, "
        "content-encoding, vary, location"
    ),
    "x-content-type-options": "nosniff",
    "cross-origin-resource-policy": "cross-origin",
}
# Sent on a preflight (OPTIONS) answer only: browsers read them nowhere else (Fetch standard,
# CORS-preflight fetch), and these two are most of the bytes of every answer.
PREFLIGHT_HEADERS = {
    "access-control-allow-methods": "GET, POST, PUT, DELETE, HEAD, OPTIONS",
    "access-control-allow-headers": (
        "content-type, authorization, if-none-match, Stream-Seq, Stream-TTL, Stream-Expires-At, "
        "Stream-Closed, Producer-Id, Producer-Epoch, Producer-Seq, Stream-Forked-From, "
        "Stream-Fork-Offset, Stream-Fork-Sub-Offset"
    ),
}

ZERO_OFFSET = "0000000000000000_0000000000000000"
FRAME_OVERHEAD = 5  # bytes counted per message, as in the reference server's offsets
DEFAULT_CONTENT_TYPE = "application/octet-stream"

_OFFSET = re.compile(r"[0-9]+_[0-9]+")
_READ_OFFSET = re.compile(r"-1|now|[0-9]+_[0-9]+")
_NONNEG = re.compile(r"0|[1-9][0-9]*")
_DIGITS = re.compile(r"[0-9]+")
_CONTENT_TYPE = re.compile(r"[\w.+-]+/[\w.+-]+")
MAX_SAFE_INT = 2**53 - 1
# C0 controls and DEL: never part of a stream name (they cannot travel in a header either).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Deepest JSON nesting an append may hold, as ``/api/chat`` (``gateway._service.MAX_JSON_DEPTH``):
#: the parser and the serialiser recurse, so deeper input would end in a ``RecursionError``.
MAX_JSON_DEPTH = 64
# An opening bracket as 2, a closing one as 0, every other byte deleted (see json_too_deep).
_BRACKETS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")

CURSOR_EPOCH_S = 1728432000.0  # 2024-10-09T00:00:00Z, the reference's cursor epoch
CURSOR_INTERVAL_S = 20


class ProtocolError(Exception):
    """A request the protocol refuses: HTTP ``status`` with a plain-text ``reason``."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or {}


def has_control(text: str) -> bool:
    """Whether ``text`` holds a C0 control character or DEL."""
    return _CONTROL.search(text) is not None


def check_stream_path(public: str) -> None:
    """Refuse a stream path (as sent, percent-escapes kept) naming a control character, or
    holding a ``.`` or ``..`` segment (raw or escaped: ``%2e%2E``).

    A NUL, CR, LF or any other C0 control or DEL, raw or percent-escaped (``%00``, ``%0A``),
    is refused before anything is read or made: such a name could not be echoed in a
    ``Location`` header (a NUL one dropped the connection after the stream was created).

    Raises:
        ProtocolError: 400.
    """
    if has_control(public) or ("%" in public and has_control(unquote(public))):
        raise ProtocolError(400, "Invalid stream path: control characters are not allowed")
    if "." in public or "%" in public:
        if any(unquote(seg) in (".", "..") for seg in public.split("/")):
            # Browsers, URL libraries and proxies rewrite them: such a stream could never be
            # named again, and behind a normalising proxy it would name another path.
            raise ProtocolError(400, "Invalid stream path: '.' and '..' segments are not allowed")


def make_offset(position: int, read_seq: int = 0) -> str:
    """An offset string for a byte ``position`` (and read sequence)."""
    return f"{read_seq:016d}_{position:016d}"


def offset_position(offset: str) -> int:
    """The byte position of a valid offset."""
    return int(offset.split("_", 1)[1])


def next_offset(current: str, size: int) -> str:
    """The offset after appending a message of ``size`` bytes at ``current``."""
    read_seq, _, pos = current.partition("_")
    return make_offset(int(pos) + FRAME_OVERHEAD + size, int(read_seq))


def valid_read_offset(offset: str) -> bool:
    """``-1``, ``now`` or ``<digits>_<digits>``."""
    return _READ_OFFSET.fullmatch(offset) is not None


def valid_offset(offset: str) -> bool:
    """``<digits>_<digits>`` (a concrete offset, as in ``Stream-Fork-Offset``)."""
    return _OFFSET.fullmatch(offset) is not None


def normalize_content_type(ct: str | None) -> str:
    """The media type without parameters, lower-cased (``""`` for none)."""
    if not ct:
        return ""
    return ct.split(";", 1)[0].strip().lower()


def is_json(ct: str | None) -> bool:
    """Whether a stream of this content type is in JSON mode."""
    return normalize_content_type(ct) == "application/json"


def sanitize_create_content_type(ct: str | None) -> str | None:
    """A usable content type from a PUT, or ``None`` when absent or malformed."""
    if not ct or not ct.strip() or not _CONTENT_TYPE.match(ct.strip()):
        return None
    return ct.strip()


def parse_ttl(raw: str) -> int:
    """``Stream-TTL``: a non-negative decimal integer without sign, zeros or spaces.

    Raises:
        ProtocolError: 400 otherwise.
    """
    if not _NONNEG.fullmatch(raw):
        raise ProtocolError(400, "Invalid Stream-TTL value")
    return int(raw)


def parse_expires_at(raw: str) -> float:
    """``Stream-Expires-At`` (RFC 3339 / ISO 8601) as epoch seconds.

    Raises:
        ProtocolError: 400 when it is not a timestamp.
    """
    text = raw.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        ts = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ProtocolError(400, "Invalid Stream-Expires-At timestamp") from exc
    if ts.tzinfo is None:
        raise ProtocolError(400, "Invalid Stream-Expires-At timestamp: a time zone is required")
    return ts.timestamp()


def parse_strict_int(raw: str, name: str) -> int:
    """A non-negative safe integer of digits only (producer epoch and sequence).

    Raises:
        ProtocolError: 400 otherwise.
    """
    if not _DIGITS.fullmatch(raw) or int(raw) > MAX_SAFE_INT:
        raise ProtocolError(400, f"Invalid {name}: must be a non-negative integer")
    return int(raw)


def process_json_append(data: bytes, *, initial: bool = False) -> bytes:
    """JSON mode: flatten one value or an array of values into a stored fragment.

    Returns:
        ``v1,v2,...,`` (each value compactly re-serialised); ``b""`` for ``[]`` on create.

    Raises:
        ProtocolError: 400 on invalid JSON (a lone surrogate escape included), JSON nested
            deeper than :data:`MAX_JSON_DEPTH`, or an empty array on append.
    """
    if json_too_deep(data):
        raise ProtocolError(400, f"Invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(400, "Invalid JSON") from exc
    if isinstance(parsed, list):
        if not parsed:
            if initial:
                return b""
            raise ProtocolError(400, "Empty arrays are not allowed")
        items = parsed
    else:
        items = [parsed]
    try:
        return ("".join(_dump(v) + "," for v in items)).encode()
    except UnicodeEncodeError as exc:
        # A lone surrogate sent as a \u escape ("\ud800") parses, but is no text UTF-8 can
        # store or a reader parse back.
        raise ProtocolError(400, "Invalid JSON: a lone surrogate (\\ud800-\\udfff) is not text") from exc


def json_too_deep(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``data`` nests arrays/objects deeper than ``limit``, found
    without parsing it (no recursion, whatever the depth).

    Brackets inside strings do not count. Text that is not JSON gets an answer too (the
    parser refuses it next). Cost: two ``bytes.count`` when there are at most ``limit``
    opening brackets (most appends), else linear, in C: the strings dropped, then one pass
    over the brackets (about 40 ns each).
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    # Outside the strings: escaped backslashes and quotes dropped (JSON allows them only in
    # strings), every other quote starts or ends one.
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    steps = b"".join(unescaped.split(b'"')[::2]).translate(_BRACKETS, _NOT_BRACKETS)
    if b"\x02" * (limit + 1) in steps:
        return True  # a run of opening brackets: the usual shape of such input, found at once
    # The depth after the k-th bracket is (sum of the first k steps) - k; all in C iterators.
    return max(map(operator.sub, accumulate(steps), count(1)), default=0) > limit


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def json_values(fragment: bytes) -> list[Any]:
    """The values of a stored JSON fragment (``v1,v2,``)."""
    text = fragment.decode("utf-8").rstrip()
    if text.endswith(","):
        text = text[:-1]
    return list(json.loads(f"[{text}]"))


def format_json(fragments: list[bytes]) -> bytes:
    """A JSON-mode response body: one array of every value in ``fragments``."""
    parts = []
    for f in fragments:
        text = f.decode("utf-8").rstrip()
        if text.endswith(","):
            text = text[:-1]
        if text:
            parts.append(text)
    return ("[" + ",".join(parts) + "]").encode()


def current_cursor(now: float | None = None) -> int:
    """The cursor interval number now (PROTOCOL.md §8.1)."""
    t = time.time() if now is None else now
    return int((t - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)


def response_cursor(client_cursor: str | None, rng: random.Random | None = None) -> str:
    """The ``Stream-Cursor`` for a live response: strictly past a client's current cursor.

    A client echoing a cursor at or past the current interval gets it advanced by a random
    jitter, so CDN-collapsed long-polls never loop on one cached response.
    """
    cur = current_cursor()
    if not client_cursor:
        return str(cur)
    try:
        client = int(client_cursor)
    except ValueError:
        return str(cur)
    if client < cur:
        return str(cur)
    jitter_s = (rng or random).randint(1, 3600)
    return str(client + max(1, -(-jitter_s // CURSOR_INTERVAL_S)))


def encode_sse_data(payload: str) -> str:
    """SSE ``data:`` lines for a payload (every CR, LF or CRLF starts a new line)."""
    lines = re.split(r"\r\n|\r|\n", payload)
    return "".join(f"data:{line}\n" for line in lines) + "\n"


def sse_event(event: str, payload: str) -> bytes:
    """One SSE event of type ``event``."""
    return (f"event: {event}\n" + encode_sse_data(payload)).encode()


def control_event(offset: str, *, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    """An SSE ``control`` event (PROTOCOL.md §5.7): offset, then cursor/upToDate or closed."""
    data: dict[str, Any] = {"streamNextOffset": offset}
    if closed:
        data["streamClosed"] = True
    else:
        if cursor is not None:
            data["streamCursor"] = cursor
        if up_to_date:
            data["upToDate"] = True
    return sse_event("control", json.dumps(data, separators=(",", ":")))


@dataclass(frozen=True)
class Producer:
    """An idempotent producer's headers on one request."""

    id: str
    epoch: int
    seq: int


_PRODUCER_ID_KEY, _PRODUCER_EPOCH_KEY, _PRODUCER_SEQ_KEY = (
    PRODUCER_ID.lower(), PRODUCER_EPOCH.lower(), PRODUCER_SEQ.lower())


def parse_producer(headers: Any) -> Producer | None:
    """The ``Producer-*`` triple, or ``None`` when none is sent.

    ``headers`` is looked up by lower-case name (Starlette's ``Headers`` or a plain dict of
    lower-case names).

    Raises:
        ProtocolError: 400 when only some are sent, the id is empty, or a number is malformed.
    """
    pid = headers.get(_PRODUCER_ID_KEY)
    epoch = headers.get(_PRODUCER_EPOCH_KEY)
    seq = headers.get(_PRODUCER_SEQ_KEY)
    if pid is None and epoch is None and seq is None:
        return None
    if pid is None or epoch is None or seq is None:
        raise ProtocolError(
            400, "All producer headers (Producer-Id, Producer-Epoch, Producer-Seq) must be provided together"
        )
    if pid == "":
        raise ProtocolError(400, "Invalid Producer-Id: must not be empty")
    return Producer(pid, parse_strict_int(epoch, "Producer-Epoch"), parse_strict_int(seq, "Producer-Seq"))


def etag(path: str, start: str, end: str, closed: bool) -> str:
    """A strong ETag for a read of ``path`` from ``start`` to ``end`` (``:c`` once closed)."""
    import base64

    return f'"{base64.b64encode(path.encode()).decode()}:{start}:{end}{":c" if closed else ""}"'
