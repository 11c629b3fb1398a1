"""How long a detached run is kept (docs/design.md §7): the default TTL, or what a client asked.

A run nobody reads is *detached*; the reaper cancels it once it stayed detached
``BATON_DETACHED_RUN_TTL`` seconds. A client may ask for more (a join's ``keepTtl``, or a
keep-alive call): the run is then kept at least until ``kept_until`` (Unix seconds) on its
record, the request clamped to the operator's maximum ``BATON_DETACHED_RUN_TTL_MAX``. A later
request never shortens what an earlier one granted. Pure rules: no clock, no store.
"""
from __future__ import annotations

import math

from baton.errors import InvalidArgument


def check_keep_ttl(value: object, field: str, *, allow_zero: bool = False) -> float:
    """A client's requested TTL in seconds, validated.

    Args:
        value: the raw value (a number, or a query string's text).
        field: the name the error names.
        allow_zero: whether 0 ("no change", a join's default) is accepted.

    Returns:
        The seconds, finite and > 0 (or 0 when ``allow_zero``).

    Raises:
        InvalidArgument: naming ``field``, for a non-number, a boolean, NaN, infinity,
            a negative value, or 0 when not allowed.
    """
    if isinstance(value, bool):
        raise InvalidArgument(field, "must be a number of seconds")
    try:
        ttl = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidArgument(field, "must be a number of seconds") from None
    if not math.isfinite(ttl) or ttl < 0 or (ttl == 0 and not allow_zero):
        raise InvalidArgument(field, "must be a finite number of seconds > 0")
    return ttl


def grant(requested: float, maximum: float) -> float:
    """The TTL granted for ``requested`` seconds: clamped to ``maximum`` (> 0)."""
    return min(requested, maximum)


def kept_until(now: float, granted: float, current: float | None) -> float:
    """The record's new ``kept_until``: ``now + granted``, never earlier than ``current``."""
    until = now + granted
    return until if current is None else max(until, current)


def reap_deadline(detached_since: float, ttl: float, kept: float | None) -> float:
    """When the reaper may cancel a run detached since ``detached_since`` (Unix seconds):
    ``ttl`` seconds after it detached, or ``kept`` when a client asked for longer."""
    due = detached_since + ttl
    return due if kept is None else max(due, kept)


def expired(detached_since: float, ttl: float, kept: float | None, now: float) -> bool:
    """Whether the reaper cancels the run at ``now`` (inclusive, as the reference reaper)."""
    return reap_deadline(detached_since, ttl, kept) <= now
