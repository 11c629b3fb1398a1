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

from dataclasses import dataclass
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


def index_of(head: Mapping[str, Any]) -> KeptIndex | None:
    """The kept chunks' index of a snapshot head, ``None`` when it has none or it is malformed
    (the kept chunks are then served whole)."""
    line, at, kind, kinds = head.get("keptLine"), head.get("keptAt"), head.get("keptKind"), head.get("keptKinds")
    if not (isinstance(line, int) and isinstance(at, list) and isinstance(kind, list) and isinstance(kinds, list)):
        return None
    if len(at) != len(kind) or not all(isinstance(x, int) for x in at):
        return None
    if not all(isinstance(k, int) and 0 <= k < len(kinds) for k in kind) or not all(isinstance(k, str) for k in kinds):
        return None
    start, lens = head.get("keptFrom"), head.get("keptLens")
    if isinstance(start, int) and isinstance(lens, list) and len(lens) == len(at) \
            and all(isinstance(n, int) and n >= 0 for n in lens):
        return KeptIndex(line, tuple(at), tuple(kinds[k] for k in kind), start, tuple(lens))
    return KeptIndex(line, tuple(at), tuple(kinds[k] for k in kind))


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
