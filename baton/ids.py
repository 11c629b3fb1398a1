"""Identifier rules and injective encodings of run ids (subjects, file names, etcd keys).

Ids (run, thread, tenant, reader, host) are 1–256 bytes of UTF-8 without control
characters. Encodings are percent-style over the unreserved alphabet ``[A-Za-z0-9_-]``:
every other byte becomes ``%XX`` (upper-case hex), so the mapping is injective, safe in a
NATS subject token (no ``.``, ``*``, ``>``, whitespace) and in a shell word.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
import unicodedata

from baton.errors import InvalidArgument

MAX_ID_BYTES = 256
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
#: A value of unreserved characters only: :func:`encode_token` returns it as it is.
_ALL_UNRESERVED = re.compile(r"[A-Za-z0-9_-]*")
_DECODE = re.compile(r"%([0-9A-F]{2})")
# File names are limited to 255 bytes; long encodings are shortened with a digest.
_MAX_FILE_STEM = 180


def validate_id(value: str, field: str) -> str:
    """Check an id and return it unchanged.

    Args:
        value: the id as sent by a caller.
        field: the request field name, used in the error.

    Returns:
        ``value``.

    Raises:
        InvalidArgument: when empty, longer than 256 UTF-8 bytes, or containing a control
            character (Unicode category ``C*`` except private use).
    """
    if not isinstance(value, str) or value == "":
        raise InvalidArgument(field, "must be a non-empty string")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise InvalidArgument(field, f"must be at most {MAX_ID_BYTES} bytes of UTF-8")
    for ch in value:
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cf", "Cs", "Cn") or ch in "\u2028\u2029":
            raise InvalidArgument(field, f"must not contain control characters (found U+{ord(ch):04X})")
    return value


#: An input id (an approval's request id, a steered message's id): it travels as one word of
#: a line in the sandbox's inbox (docs/hitl.md), so it is plain ASCII; ``eof`` is reserved
#: (it closes the agent's input).
INPUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
EOF_INPUT_ID = "eof"


def validate_input_id(value: str, field: str) -> str:
    """Check an input id (:data:`INPUT_ID`, not ``eof``) and return it unchanged.

    Raises:
        InvalidArgument: otherwise.
    """
    if not isinstance(value, str) or not INPUT_ID.fullmatch(value) or value == EOF_INPUT_ID:
        raise InvalidArgument(field, "must be 1-128 characters of A-Z a-z 0-9 . _ : - starting with a "
                              "letter or digit (and not \"eof\")")
    return value


def input_id_for(raw: str) -> str:
    """The input id an id chosen elsewhere (an agent's approval request id) goes under.

    Args:
        raw: any string (lone surrogates included).

    Returns:
        ``raw`` when it is an input id (:func:`validate_input_id`), else ``a-`` and the first
        40 hex digits of the SHA-256 of its UTF-8 (surrogates passed through): the same on
        every host and every replay of a journal, so a successor derives the id its
        predecessor stored. Never raises.
    """
    if INPUT_ID.fullmatch(raw) and raw != EOF_INPUT_ID:
        return raw
    return "a-" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def encode_token(value: str) -> str:
    """Injective, subject- and shell-safe encoding of an id (``%XX`` escapes)."""
    if _ALL_UNRESERVED.fullmatch(value):  # the usual id: nothing to escape (a hot path)
        return value
    out: list[str] = []
    for b in value.encode("utf-8", "surrogatepass"):
        out.append(chr(b) if b in _UNRESERVED else f"%{b:02X}")
    return "".join(out)


def decode_token(token: str) -> str:
    """Inverse of :func:`encode_token`."""
    raw = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "%":
            raw.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.append(ord(token[i]))
            i += 1
    return raw.decode("utf-8", "surrogatepass")


def subject_token(run_id: str) -> str:
    """The run's token in ``baton.runs.<token>``."""
    return encode_token(run_id)


def file_stem(run_id: str) -> str:
    """Shell-safe, injective file stem for a run's journal (``<stem>.ndjson``).

    Stems longer than 180 characters keep a readable prefix and append the SHA-256 of the
    id, so they stay under the 255-byte file-name limit; ``%`` never appears in the
    shortened form's digest part, and a short stem never contains ``~``, so the two forms
    cannot collide.
    """
    enc = encode_token(run_id)
    if len(enc) <= _MAX_FILE_STEM:
        return enc
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{enc[:100]}~{digest}"


# --- list positions and page tokens (ListRuns, docs/design.md §3.5) ---------------------------

_POSITION = re.compile(rb"\d{20}/[A-Za-z0-9_%-]+")
_THREAD_POSITION = re.compile(rb"\d{20}/\d{20}/[A-Za-z0-9_%-]+")


def micros(t: float) -> int:
    """Unix seconds → integer microseconds (the unit of the coordinator's time indexes)."""
    return int(math.floor(t * 1_000_000 + 0.5))


def run_position(started_at: float, run_id: str) -> bytes:
    """Where a run sits in a listing oldest first: ``started_at`` in µs, then the encoded
    run id (the suffix of its ``started/.../a/`` index key in etcd)."""
    return f"{micros(started_at):020d}/{encode_token(run_id)}".encode()


def thread_run_position(thread_seq: int, started_at: float, run_id: str) -> bytes:
    """Where a run sits in its thread's listing, earliest first (:mod:`baton.thread_order`):
    its number in the thread, then ``started_at`` in µs and the encoded run id (which decide
    only between runs numbered 0, created before numbers)."""
    return f"{thread_seq:020d}/{micros(started_at):020d}/{encode_token(run_id)}".encode()


def page_token(position: bytes) -> str:
    """The opaque ``next_page_token`` for a page that ended at ``position``."""
    return base64.urlsafe_b64encode(position).decode().rstrip("=")


def page_position(token: str, *, thread: bool = False) -> bytes:
    """The position a ``page_token`` names (the next page starts strictly after it).

    Args:
        token: the token.
        thread: a token of a thread's listing (:func:`thread_run_position`), not of a
            tenant-wide one (:func:`run_position`).

    Raises:
        InvalidArgument: ``page_token`` is not a token :func:`page_token` made for this
            kind of listing.
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (ValueError, binascii.Error):
        raw = b""
    if not (_THREAD_POSITION if thread else _POSITION).fullmatch(raw):
        raise InvalidArgument("page_token", "is not a token this API returned")
    return raw
