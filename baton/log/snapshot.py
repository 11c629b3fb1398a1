"""Snapshots of a run's delivery log, as one pure rule (docs/design.md §4.6).

A snapshot stands for every chunk of the log up to an offset: a join from it gets the
snapshot's events, then every chunk after that offset, and a client ends up where a join
from the start would have left it. Its events, in order:

* the run's first ``RUN_STARTED`` chunk (AG-UI clients want a run to start before anything);
* ``MESSAGES_SNAPSHOT``: the messages so far, as :class:`baton.transcript.TranscriptBuilder`
  assembles them (the run input, then what the run produced);
* the run's state: its last ``STATE_SNAPSHOT`` and the ``STATE_DELTA`` chunks after it, as
  they are (no JSON patch is applied here, so nothing can be lost in applying it);
* every chunk the messages do not hold, as it is, in log order: ``CUSTOM`` (approval
  requests, usage, agent notes…), ``RAW``, ``SUBAGENT_*`` and ``ACTIVITY_DELTA``. A snapshot
  is never lossy: what a client could learn from the chunks it stands for, it learns from it;
* the terminal chunk (``RUN_FINISHED`` / ``RUN_ERROR``) once the log holds one.

Each kept chunk's position is recorded with it: how many messages the transcript held when it
came (``keptAt`` in the record's head, with each one's kind). A reader that serves only the
newest messages (gateway/_snapshots.py) serves the kept chunks that came with them whole, and
of the older ones only the state they leave (gateway/_kept.py), never parsing them.

Only the structure of closed spans is left out (``*_START``/``*_END`` of messages, tool
calls, reasoning and steps, and their deltas): the messages hold all they carried.

When one is due is decided by the chunks alone (never by time, records of other kinds or
who wrote them), so a writer that takes a run over and primes itself from the stored log
(:meth:`SnapshotState.restore` on the last stored snapshot, then :meth:`SnapshotState.feed`
of the chunks after it) writes byte for byte the snapshot its predecessor would have.

* due after a chunk when, since the last snapshot, at least ``chunks`` chunks or ``bytes``
  bytes of chunk JSON were appended (whichever first), **and** at least as many bytes of
  chunk JSON as the last snapshot's body weighs (so a run's snapshots together stay within
  about twice its log, not its log times the number of snapshots), **and** the log is at a
  quiet point:
  no text/reasoning message, tool call, step or reasoning span is open, and the chunk is not
  a ``*_CHUNK`` convenience event (whose message a client closes only on the next event). A
  join from a quiet point never gets a ``*_CONTENT`` for a message it was not shown opening.
* at the log's close, a final snapshot when any chunk came after the last one.

The record body is compact, key-sorted JSON (:func:`encode`), so equal state is equal bytes.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from baton.transcript import TranscriptBuilder

Chunk = dict[str, Any]

#: Version of the record body; a reader refuses other versions (it joins from the start).
VERSION = 1

_OPEN = {"TEXT_MESSAGE_START": "m", "REASONING_MESSAGE_START": "r", "TOOL_CALL_START": "t",
         "STEP_STARTED": "s", "REASONING_START": "p", "THINKING_START": "k", "THINKING_TEXT_MESSAGE_START": "K"}
_CLOSE = {"TEXT_MESSAGE_END": "m", "REASONING_MESSAGE_END": "r", "TOOL_CALL_END": "t",
          "STEP_FINISHED": "s", "REASONING_END": "p", "THINKING_END": "k", "THINKING_TEXT_MESSAGE_END": "K"}
_KEY = {"m": "messageId", "r": "messageId", "t": "toolCallId", "s": "stepName", "p": "messageId",
        "k": "", "K": ""}
_TERMINAL = ("RUN_FINISHED", "RUN_ERROR")
#: Chunks the messages do not hold: kept in the snapshot as they are.
KEPT = frozenset({"CUSTOM", "RAW", "SUBAGENT_STARTED", "SUBAGENT_FINISHED", "SUBAGENT_ERROR", "ACTIVITY_DELTA"})


@dataclass(frozen=True)
class SnapshotPolicy:
    """When a snapshot is due (``BATON_SNAPSHOT_CHUNKS``, ``BATON_SNAPSHOT_BYTES``).

    Attributes:
        chunks: chunks since the last snapshot that make one due (0: never by count).
        bytes: bytes of chunk JSON since the last snapshot that make one due (0: never by size).
    """

    chunks: int = 5000
    bytes: int = 1 << 20

    @property
    def enabled(self) -> bool:
        """Whether snapshots are written at all (both thresholds 0: never)."""
        return self.chunks > 0 or self.bytes > 0


@dataclass(frozen=True)
class Snapshot:
    """A decoded snapshot record.

    Attributes:
        offset: the stream sequence of the last chunk it covers; a join from it reads on
            strictly after this offset.
        chunks: how many chunks it covers.
        events: the AG-UI events a client gets in place of those chunks (module docstring).
        input_count: how many of the ``MESSAGES_SNAPSHOT`` messages are the run's input.
    """

    offset: int
    chunks: int
    events: tuple[Chunk, ...]
    input_count: int
    body: bytes = field(default=b"", compare=False, repr=False)  #: :func:`encode`'s result, when known
    #: for each kept chunk (:data:`KEPT`, in order), how many messages the transcript held when
    #: it came (``None``: unknown, a snapshot written before positions were recorded).
    kept_at: tuple[int, ...] | None = field(default=None, compare=False)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The ``MESSAGES_SNAPSHOT`` messages."""
        for ev in self.events:
            if ev.get("type") == "MESSAGES_SNAPSHOT":
                return list(ev.get("messages") or [])
        return []


class SnapshotState:
    """The part of a run's log a snapshot needs, fed chunk by chunk (deterministic).

    Args:
        policy: the thresholds.
    """

    def __init__(self, policy: SnapshotPolicy) -> None:
        self.policy = policy
        self._builder = TranscriptBuilder()
        self._started: Chunk | None = None
        self._terminal: Chunk | None = None
        self._state: list[Chunk] = []
        self._kept: list[Chunk] = []
        self._kept_at: list[int] | None = []
        self._open: set[tuple[str, str]] = set()
        self._last_type = ""
        self._chunks = 0          # chunks covered so far
        self._offset = 0          # stream sequence of the last chunk fed
        self._since_chunks = 0    # since the last snapshot
        self._since_bytes = 0
        self._last_size = 0       # bytes of the last snapshot's body

    @classmethod
    def restore(cls, policy: SnapshotPolicy, snap: Snapshot) -> "SnapshotState":
        """The state right after ``snap`` was taken (the next snapshot counts from it)."""
        st = cls(policy)
        msgs = snap.messages
        st._builder = TranscriptBuilder.resumed(msgs[:snap.input_count], msgs[snap.input_count:])
        for ev in snap.events:
            t = ev.get("type")
            if t == "RUN_STARTED":
                st._started = copy.deepcopy(ev)
            elif t in _TERMINAL:
                st._terminal = copy.deepcopy(ev)
            elif t in ("STATE_SNAPSHOT", "STATE_DELTA"):
                st._state.append(copy.deepcopy(ev))
            elif t in KEPT:
                st._kept.append(copy.deepcopy(ev))
        known = not st._kept or (snap.kept_at is not None and len(snap.kept_at) == len(st._kept))
        st._kept_at = list(snap.kept_at or ()) if known else None  # unknown stays unknown
        st._chunks, st._offset = snap.chunks, snap.offset
        st._last_size = len(snap.body or encode(snap))
        return st

    @property
    def offset(self) -> int:
        """Stream sequence of the last chunk fed (0: none)."""
        return self._offset

    @property
    def pending(self) -> int:
        """Chunks fed since the last snapshot."""
        return self._since_chunks

    def feed(self, offset: int, chunk: Mapping[str, Any], size: int) -> bool:
        """Apply one stored chunk.

        Args:
            offset: its stream sequence.
            chunk: the chunk (AG-UI camelCase dict).
            size: its stored JSON size in bytes.

        Returns:
            Whether a snapshot is due right after this chunk.
        """
        c = dict(chunk)
        self._builder.feed(c)
        t = str(c.get("type") or "")
        if t == "RUN_STARTED" and self._started is None:
            self._started = copy.deepcopy(c)
        elif t in _TERMINAL:
            self._terminal = copy.deepcopy(c)
        elif t == "STATE_SNAPSHOT":
            self._state = [copy.deepcopy(c)]
        elif t == "STATE_DELTA":
            self._state.append(copy.deepcopy(c))
        elif t in KEPT:
            self._kept.append(copy.deepcopy(c))
            if self._kept_at is not None:
                self._kept_at.append(self._builder.count)
        if t in _OPEN:
            k = _OPEN[t]
            self._open.add((k, str(c.get(_KEY[k], "")) if _KEY[k] else ""))
        elif t in _CLOSE:
            k = _CLOSE[t]
            self._open.discard((k, str(c.get(_KEY[k], "")) if _KEY[k] else ""))
        self._last_type = t
        self._chunks += 1
        self._offset = offset
        self._since_chunks += 1
        self._since_bytes += size
        return self.due()

    def due(self) -> bool:
        """Whether a snapshot is due now (thresholds reached at a quiet point)."""
        p = self.policy
        reached = (p.chunks > 0 and self._since_chunks >= p.chunks) or (p.bytes > 0 and self._since_bytes >= p.bytes)
        return reached and self._since_bytes >= self._last_size and self.quiet

    @property
    def quiet(self) -> bool:
        """Nothing open, and the last chunk is not a ``*_CHUNK`` event."""
        return not self._open and not self._last_type.endswith("_CHUNK")

    def take(self) -> Snapshot:
        """The snapshot of everything fed so far; the thresholds count from here on."""
        events: list[Chunk] = []
        if self._started is not None:
            events.append(copy.deepcopy(self._started))
        input_msgs, out = self._builder.parts()
        events.append({"type": "MESSAGES_SNAPSHOT", "messages": input_msgs + out})
        events.extend(copy.deepcopy(s) for s in self._state)
        events.extend(copy.deepcopy(k) for k in self._kept)
        if self._terminal is not None:
            events.append(copy.deepcopy(self._terminal))
        self._since_chunks = 0
        self._since_bytes = 0
        kept_at = tuple(self._kept_at) if self._kept_at is not None else None
        snap = Snapshot(self._offset, self._chunks, tuple(events), len(input_msgs), kept_at=kept_at)
        body = encode(snap)
        self._last_size = len(body)
        return Snapshot(snap.offset, snap.chunks, snap.events, snap.input_count, body, kept_at)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")


#: How :func:`encode` writes a ``MESSAGES_SNAPSHOT`` line around its messages (compact,
#: key-sorted: ``messages`` sorts before ``type``).
MESSAGES_HEAD = b'{"messages":['
MESSAGES_TAIL = b'],"type":"MESSAGES_SNAPSHOT"}'


def messages_line(messages: list[Any]) -> tuple[bytes, list[int]]:
    """A ``MESSAGES_SNAPSHOT`` event's line, and where each message ends in it (byte index,
    exclusive): the same bytes as ``_dumps`` of the event, since compact JSON of a list is its
    items' JSON joined by commas."""
    line = bytearray(MESSAGES_HEAD)
    ends: list[int] = []
    for i, m in enumerate(messages):
        if i:
            line += b","
        line += _dumps(m)
        ends.append(len(line))
    line += MESSAGES_TAIL
    return bytes(line), ends


def encode(snap: Snapshot) -> bytes:
    """The record body: a head line, then one line per event; compact, key-sorted UTF-8 JSON
    (equal snapshots, equal bytes). Compact JSON never holds a raw newline, so a reader that
    only serves the events splits lines and never parses them (:func:`event_lines`).

    The head's ``keptLine``, ``keptAt``, ``keptKind``, ``keptKinds``, ``keptFrom`` and
    ``keptLens`` (written when the kept chunks' positions are known) say which event line is the
    first kept chunk, each one's position (:attr:`Snapshot.kept_at`), its kind (an index into
    ``keptKinds``: :func:`kept_kind`), where the first one begins (bytes from the first event
    line's start) and each one's length in bytes: a reader reads only the parts that hold the
    kept chunks it serves.

    The head's ``msgEnds`` says where each message of the ``MESSAGES_SNAPSHOT`` line ends (byte
    index in that line), so a reader serves the newest messages, or an older page of them, by
    slicing the line, never parsing it (gateway/_snapshots.py). A head without it (written
    before it existed) is read as well: the reader then parses the line once.
    """
    head: dict[str, Any] = {"v": VERSION, "offset": snap.offset, "chunks": snap.chunks,
                            "inputCount": snap.input_count}
    lines: list[bytes] = []
    kept_lines: list[int] = []
    kinds: dict[str, int] = {}
    kind_of: list[int] = []
    for ev in snap.events:
        if ev.get("type") == "MESSAGES_SNAPSHOT" and set(ev) == {"type", "messages"} and "msgEnds" not in head:
            line, ends = messages_line(list(ev.get("messages") or []))
            head["msgEnds"] = ends
            lines.append(line)
        else:
            if ev.get("type") in KEPT:
                kept_lines.append(len(lines))
                kind_of.append(kinds.setdefault(kept_kind(ev), len(kinds)))
            lines.append(_dumps(ev))
    at = snap.kept_at
    contiguous = kept_lines == list(range(kept_lines[0], kept_lines[0] + len(kept_lines))) if kept_lines else False
    if at is not None and contiguous and len(at) == len(kept_lines):
        head.update(keptLine=kept_lines[0], keptAt=list(at), keptKind=kind_of, keptKinds=list(kinds),
                    keptFrom=sum(len(ln) + 1 for ln in lines[:kept_lines[0]]),
                    keptLens=[len(lines[i]) for i in kept_lines])
    return b"\n".join([_dumps(head)] + lines)


def kept_kind(chunk: Mapping[str, Any]) -> str:
    """What a reader folding kept chunks needs to know of one without parsing it: ``CUSTOM:<name>``,
    ``SUBAGENT_STARTED:<subagentRunId>``, ``SUBAGENT_END:<subagentRunId>`` (finished or failed),
    else its type."""
    t = str(chunk.get("type") or "")
    if t == "CUSTOM":
        return f"CUSTOM:{chunk.get('name', '')}"
    if t == "SUBAGENT_STARTED":
        return f"SUBAGENT_STARTED:{chunk.get('subagentRunId', '')}"
    if t in ("SUBAGENT_FINISHED", "SUBAGENT_ERROR"):
        return f"SUBAGENT_END:{chunk.get('subagentRunId', '')}"
    return t


def event_lines(data: bytes) -> tuple[int, list[bytes]]:
    """``(offset, each event's JSON bytes)`` of a body, parsing only its head line.

    Raises:
        ValueError: not a snapshot body of this version.
    """
    head, lines = head_and_lines(data)
    return int(head["offset"]), lines


def head_and_lines(data: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """``(head, each event's JSON bytes)`` of a body, parsing only its head line (the head's
    ``offset``, ``chunks``, ``inputCount`` and, when written, ``msgEnds``: :func:`encode`).

    Raises:
        ValueError: not a snapshot body of this version.
    """
    head_raw, _, rest = data.partition(b"\n")
    return _head(head_raw), rest.split(b"\n") if rest else []


def parse_head(raw: bytes) -> dict[str, Any]:
    """A body's head line, checked (:func:`encode`).

    Raises:
        ValueError: not a snapshot head of this version.
    """
    return _head(raw)


def _head(raw: bytes) -> dict[str, Any]:
    try:
        head = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"snapshot head is not JSON: {exc}") from None
    if not isinstance(head, dict) or head.get("v") != VERSION or not isinstance(head.get("offset"), int):
        raise ValueError("snapshot body of an unknown version")
    return head


def decode(data: bytes) -> Snapshot:
    """Parse a record body written by :func:`encode`.

    Raises:
        ValueError: not a snapshot body of this version.
    """
    head_raw, _, rest = data.partition(b"\n")
    head = _head(head_raw)
    try:
        events = [json.loads(line) for line in rest.split(b"\n")] if rest else []
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"snapshot event is not JSON: {exc}") from None
    if not all(isinstance(ev, dict) for ev in events):
        raise ValueError("snapshot event is not an object")
    at = head.get("keptAt")
    kept_at = tuple(int(x) for x in at) if isinstance(at, list) else None
    if kept_at is None and not any(ev.get("type") in KEPT for ev in events):
        kept_at = ()  # nothing kept: no position is unknown
    return Snapshot(int(head["offset"]), int(head.get("chunks", 0)), tuple(events), int(head.get("inputCount", 0)),
                    kept_at=kept_at)


def split(body: bytes, part_bytes: int) -> list[bytes]:
    """``body`` in parts of at most ``part_bytes`` (one record each: JetStream caps a message)."""
    if part_bytes < 1:
        raise ValueError("part_bytes must be >= 1")
    return [body[i:i + part_bytes] for i in range(0, len(body), part_bytes)] or [b""]


def replay(chunks: list[tuple[int, Chunk, int]], policy: SnapshotPolicy, *, closed: bool = False) -> list[Snapshot]:
    """Every snapshot the rule writes over a whole log: ``(offset, chunk, size)`` in order.

    The reference the writer is tested against (a successor's snapshots equal these).
    ``closed``: the log ends with its close record (the final snapshot is written).
    """
    st = SnapshotState(policy)
    out: list[Snapshot] = []
    for offset, chunk, size in chunks:
        if st.feed(offset, chunk, size):
            out.append(st.take())
    if closed and st.pending:
        out.append(st.take())
    return out
