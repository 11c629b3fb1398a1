"""Pages of a thread's messages, newest first, behind an opaque cursor. Pure.

A long thread is read a window at a time: the first page is the newest ``limit`` messages
(in conversation order, oldest of the window first), and its cursor names where the next
older window ends. A cursor is the position (from the thread's start) and id of the oldest
message the page holds, base64url-encoded: messages are only ever appended to a thread,
so a position stays true while newer messages arrive; the id catches a cursor of another
thread or of a transcript that was replaced (a fork's, a deleted thread's) and is refused
rather than answered with the wrong window.
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Generic, NamedTuple, Sequence, TypeVar

from baton.errors import InvalidArgument

T = TypeVar("T", bound=dict[str, Any])

#: The largest window one request may ask for (messages).
MAX_PAGE = 1000


def check_limit(raw: str | int | None, field: str = "limit") -> int:
    """A page size: 1..:data:`MAX_PAGE`, ``0``/``None`` for the whole thread.

    Raises:
        InvalidArgument: not an integer in range.
    """
    if raw is None or raw == "":
        return 0
    try:
        n = int(raw)
    except (TypeError, ValueError):
        raise InvalidArgument(field, f"must be an integer 1..{MAX_PAGE}") from None
    if n < 0 or n > MAX_PAGE:
        raise InvalidArgument(field, f"must be an integer 1..{MAX_PAGE}")
    return n


class Page(NamedTuple, Generic[T]):
    """One window of a thread's messages.

    Attributes:
        messages: the window, oldest first.
        cursor: where the next older window ends (``""``: nothing older is left).
        start: the window's first message's position in the thread (0-based).
    """

    messages: list[T]
    cursor: str
    start: int


def cursor_of(position: int, message_id: str) -> str:
    """The opaque cursor of the window whose oldest message is at ``position``."""
    raw = json.dumps([position, message_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def check_cursor(before: str | None, field: str = "before") -> tuple[int, str] | None:
    """``(position, message id)`` of a cursor, ``None`` for none; check it before reading.

    Raises:
        InvalidArgument: not a cursor :func:`cursor_of` made.
    """
    if not before:
        return None
    try:
        raw = base64.urlsafe_b64decode(before + "=" * (-len(before) % 4))
        position, mid = json.loads(raw)
        if not isinstance(position, int) or isinstance(position, bool) or not isinstance(mid, str):
            raise ValueError(before)
    except (ValueError, binascii.Error, TypeError):
        raise InvalidArgument(field, "is not a cursor this API returned") from None
    return position, mid


def window(messages: Sequence[T], limit: int, before: str | None, field: str = "before") -> Page[T]:
    """One page of ``messages`` (oldest first): the newest ``limit`` before ``before``.

    Args:
        messages: the whole thread, oldest first; each with an ``id``.
        limit: page size; ``0`` answers every message before the cursor.
        before: a cursor this function returned, or ``None``/``""`` for the newest page.

    Returns:
        The :class:`Page`.

    Raises:
        InvalidArgument: ``before`` is not a cursor of this thread.
    """
    end = len(messages)
    parsed = check_cursor(before, field)
    if parsed is not None:
        position, mid = parsed
        if not 0 <= position < len(messages) or str(messages[position].get("id", "")) != mid:
            raise InvalidArgument(field, "is not a cursor of this thread's messages")
        end = position
    start = max(0, end - limit) if limit else 0
    cursor = cursor_of(start, str(messages[start].get("id", ""))) if start > 0 else ""
    return Page(list(messages[start:end]), cursor, start)
