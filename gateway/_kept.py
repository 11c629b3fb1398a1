"""Which kept chunks a window of a snapshot's newest messages serves (pure).

A snapshot keeps every chunk its messages do not hold (``CUSTOM``, ``RAW``, ``SUBAGENT_*``,
``ACTIVITY_DELTA``: baton.log.snapshot), in log order, with the number of messages the
transcript held when each came (its position). A join from the newest messages
(``messages=N``) leaves the older messages out, to be paged; of the kept chunks it serves:

* every one whose position is inside the window (it came with the messages shown), whole;
* of the older ones, only the state they leave, not each event:

  - a ``CUSTOM`` whose value a later one of the same name replaces (:data:`LATEST`: the
    agent's init, its result and usage, its rate-limit status, a Codex thread id): only the
    run's last of that name, and only when no later one of that name is served;
  - a ``CUSTOM`` about the moment it came (:data:`MOMENT`: a turn's usage, a message's stop
    reason, a compaction, a local command, a failed turn, thinking progress): left out with
    the older messages it came with;
  - a subagent's ``SUBAGENT_STARTED`` and its end, when both are older: left out (its messages
    are older too); one still running (no older end) keeps its start;
  - everything else (``RAW``, ``ACTIVITY_DELTA``, approvals, run notices, names not known
    here) is served whole: nothing whose meaning this rule does not know is folded away.

How many were left out is said in the window's ``snapshot.window`` event (``eventsOmitted``),
never a silent gap. A reader learns the kept chunks' kinds and positions from the snapshot
record's head (baton.log.snapshot.encode), so nothing is parsed to fold them.
"""
from __future__ import annotations

import operator
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate, compress, islice
from typing import Any, Mapping

#: CUSTOM names whose latest value is what a reader needs (a later one replaces an earlier one).
LATEST = frozenset({"claude.init", "claude.result", "codex.usage", "codex.thread", "agent.rate_limit"})
#: CUSTOM names about the moment (turn, message) they came: they go with that moment's messages.
MOMENT = frozenset({"turn.usage", "claude.stop_reason", "claude.thinking_tokens", "agent.compaction",
                    "agent.compaction_summary", "agent.local_command", "codex.turn_failed", "codex.warning",
                    "claude.stream_mismatch", "claude.assistant.error"})


@dataclass(frozen=True)
class KeptIndex:
    """Where a snapshot's kept chunks are and what they are (its record head's ``kept*`` fields).

    Attributes:
        line: index, among the snapshot's event lines, of the first kept chunk (they follow
            one another).
        at: each kept chunk's position (messages the transcript held when it came).
        kind: each kept chunk's kind (baton.log.snapshot.kept_kind).
    """

    line: int
    at: tuple[int, ...]
    kind: tuple[str, ...]
    start: int = -1  #: bytes from the first event line's start to the first kept chunk's (-1: unknown)
    lens: tuple[int, ...] = ()  #: each kept chunk's line length in bytes (empty: unknown)

    def spans(self) -> list[tuple[int, int]]:
        """Each kept chunk's ``(start, end)`` in bytes from the first event line's start (the
        lines are one after another, a newline between two)."""
        out, at = [], self.start
        for n in self.lens:
            out.append((at, at + n))
            at += n + 1
        return out

    def starts(self) -> list[int]:
        """Where each kept chunk starts, in bytes from the first event line's start, and past
        the last one where its line's newline ends (``len(lens) + 1`` numbers, summed in C: a
        long run's snapshot keeps tens of thousands)."""
        return list(accumulate(map((1).__add__, self.lens), initial=self.start))


def _ints(xs: list[Any]) -> bool:
    # One pass in C over tens of thousands of numbers (a long run's head), not a Python loop.
    return set(map(type, xs)) <= {int}


def index_of(head: Mapping[str, Any]) -> KeptIndex | None:
    """The kept chunks' index of a snapshot head, ``None`` when it has none or it is malformed
    (the kept chunks are then served whole)."""
    line, at, kind, kinds = head.get("keptLine"), head.get("keptAt"), head.get("keptKind"), head.get("keptKinds")
    if not (isinstance(line, int) and isinstance(at, list) and isinstance(kind, list) and isinstance(kinds, list)):
        return None
    if len(at) != len(kind) or not _ints(at):
        return None
    if not _ints(kind) or (kind and not 0 <= min(kind) <= max(kind) < len(kinds)) \
            or not all(isinstance(k, str) for k in kinds):
        return None
    names = tuple(map(kinds.__getitem__, kind))
    start, lens = head.get("keptFrom"), head.get("keptLens")
    if isinstance(start, int) and isinstance(lens, list) and len(lens) == len(at) and _ints(lens) \
            and (not lens or min(lens) >= 0):
        return KeptIndex(line, tuple(at), names, start, tuple(lens))
    return KeptIndex(line, tuple(at), names)


def served(index: KeptIndex, first: int) -> list[bool]:
    """For each kept chunk, whether a window whose oldest message is at position ``first`` serves
    it (module docstring)."""
    n = len(index.at)
    older = [index.at[i] < first for i in range(n)]
    last_of: dict[str, int] = {}
    ended: set[str] = set()
    for i, kind in enumerate(index.kind):
        last_of[kind] = i
        if older[i] and kind.startswith("SUBAGENT_END:"):
            ended.add(kind.partition(":")[2])
    out = []
    for i, kind in enumerate(index.kind):
        if not older[i]:
            out.append(True)
            continue
        family, _, name = kind.partition(":")
        if family == "CUSTOM" and name in LATEST:
            out.append(last_of[kind] == i)
        elif family == "CUSTOM" and name in MOMENT:
            out.append(False)
        elif family == "SUBAGENT_END":
            out.append(False)
        elif family == "SUBAGENT_STARTED":
            out.append(name not in ended)
        else:
            out.append(True)
    return out


def served_indices(index: KeptIndex, first: int) -> list[int]:
    """The kept chunks :func:`served` serves, by index in order: the same answer without a Python
    step per kept chunk when the positions only grow (they do: a transcript's message count
    never shrinks), so a window of a run that kept tens of thousands costs what its kinds do.
    Positions out of order are answered by :func:`served` itself."""
    at, kind = index.at, index.kind
    n = len(at)
    if first <= 0 or not n:
        return list(range(n))
    if not all(map(operator.le, at, islice(at, 1, None))):
        return list(compress(range(n), served(index, first)))
    k = bisect_left(at, first)  # the older ones are the first k
    older = kind[:k]
    present = set(older)
    ended = {kd.partition(":")[2] for kd in present if kd.startswith("SUBAGENT_END:")}
    whole: set[str] = set()
    singles: list[int] = []
    for kd in present:
        family, _, name = kd.partition(":")
        if family == "CUSTOM" and name in LATEST:
            last = n - 1 - kind[::-1].index(kd)
            if last < k:  # the run's last of that name is older than the window: it alone
                singles.append(last)
        elif (family == "CUSTOM" and name in MOMENT) or family == "SUBAGENT_END":
            continue
        elif family != "SUBAGENT_STARTED" or name not in ended:
            whole.add(kd)
    picked = list(compress(range(k), map(whole.__contains__, older))) if whole else []
    return sorted(picked + singles) + list(range(k, n))


def fold(lines: list[bytes], index: KeptIndex | None, offset: int, first: int) -> tuple[list[bytes], int]:
    """``lines`` (a snapshot's event lines from its line ``offset`` on) with the kept chunks a
    window from position ``first`` does not serve left out: ``(lines, how many were left out)``.
    ``index`` ``None`` (positions unknown) or ``first`` 0 (nothing older): every line."""
    if index is None or first <= 0:
        return lines, 0
    lo = index.line - offset
    if lo < 0 or lo + len(index.at) > len(lines):
        return lines, 0  # the index does not match these lines: served whole, never cut wrongly
    keep = served(index, first)
    kept = [ln for ln, k in zip(lines[lo:lo + len(keep)], keep) if k]
    return lines[:lo] + kept + lines[lo + len(keep):], len(keep) - len(kept)
