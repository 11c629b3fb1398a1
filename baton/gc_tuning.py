"""CPython's cyclic garbage collector, tuned for a long-lived server process.

CPython collects its youngest generation every 700 net allocations of container objects,
and all three generations once ten middle collections came and the objects that survived
since the last full collection exceed a quarter of those it kept (CPython 3.11,
``Modules/gcmodule.c``, ``collect_generations``). A full collection walks every container
the process holds, with the event loop stopped. A gateway serving 1,000 readers holds
enough that each took 100–230 ms, and it ran three or four times in a ten-second burst of
chunks to them: the paced readers' p99 was the length of one such pause, not the cost of
delivery (bench/results/README.md, "The collector's pauses").

Two changes, both stock ``gc`` calls:

- :func:`tune_collector` raises the youngest generation's threshold (:data:`THRESHOLD`):
  the short-lived objects of a request or a delivered chunk die before a collection comes,
  so far fewer survive into the old generation and start a full collection. Objects in
  reference cycles are freed later (after 10,000 allocations instead of 700): what a cycle
  holds waits longer. A failed call's error is such a cycle (asyncio's task, grpcio's call),
  and its frames held the request: ``baton.errors.drop_frames``, called where errors are mapped,
  empties them.
- :func:`freeze_startup`, once a service is ready, moves everything alive then (modules,
  classes, settings, clients: what lives as long as the process) to the permanent
  generation, which no collection walks (``gc.freeze``, Python 3.7+).

``BATON_GC_THRESHOLD`` sets the thresholds, or ``default`` keeps Python's (and freezes
nothing).
"""
from __future__ import annotations

import gc
import re
from typing import Mapping

from baton import config

#: The collector's thresholds (youngest, middle, oldest) a service runs with: only the
#: youngest differs from Python's (700, 10, 10).
THRESHOLD = (10_000, 10, 10)
#: The value of ``BATON_GC_THRESHOLD`` that keeps Python's collector as it is.
DEFAULT = "default"
VARIABLE = "BATON_GC_THRESHOLD"
_C_INT_MAX = 2**31 - 1  # gc.set_threshold takes C ints (OverflowError past this)
_DIGITS = re.compile(r"[0-9]{1,10}")
# Whether tune_collector set thresholds in this process (the collector is process-wide too).
_tuned = False


def threshold_from(value: str) -> tuple[int, int, int] | None:
    """The thresholds ``BATON_GC_THRESHOLD`` names: ``"N0,N1,N2"`` (integers from 1 to
    2**31 - 1 in ASCII digits, what ``gc.set_threshold`` takes), or
    ``None`` for ``default`` (Python's collector untouched).

    Raises:
        ValueError: naming the variable, for anything else.
    """
    value = value.strip()
    if value == DEFAULT:
        return None
    parts = [p.strip() for p in value.split(",")]
    # ASCII digits only: int() also takes "1_000", "+5" and other scripts' digits.
    numbers = tuple(int(p) for p in parts if _DIGITS.fullmatch(p))
    if len(parts) != 3 or len(numbers) != 3 or min(numbers) < 1 or max(numbers) > _C_INT_MAX:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise ValueError(f"{VARIABLE} must be three positive integers (gen0,gen1,gen2) up to {_C_INT_MAX}, "
                         f"or {DEFAULT!r}, got {shown!r}")
    return numbers[0], numbers[1], numbers[2]


def tune_collector(env: Mapping[str, str] | None = None) -> tuple[int, int, int] | None:
    """Set the collector's thresholds from ``BATON_GC_THRESHOLD`` (its default is
    :data:`THRESHOLD`).
    Call it early in a service's ``main``, before its imports of the heavy modules.

    Returns:
        The thresholds set, or ``None`` when the variable says ``default``.

    Raises:
        ValueError: a malformed value (:func:`threshold_from`); nothing was changed.
    """
    threshold = threshold_from(config.get(VARIABLE, env))
    global _tuned
    if threshold is not None:
        gc.set_threshold(*threshold)
        _tuned = True
    return threshold


def freeze_startup() -> int:
    """Collect once, then move every object alive to the permanent generation: later
    collections walk only what the service made since. Call it once the service is ready
    (its clients built, its port bound). Does nothing unless :func:`tune_collector` set
    thresholds in this process (``BATON_GC_THRESHOLD=default`` keeps Python's collector
    whole).

    Returns:
        The number of objects frozen (0 when nothing was done).
    """
    if not _tuned:
        return 0
    gc.collect()  # garbage left by start-up is freed, not kept for the process's life
    gc.freeze()
    return gc.get_freeze_count()


__all__ = ["DEFAULT", "THRESHOLD", "VARIABLE", "freeze_startup", "threshold_from", "tune_collector"]
