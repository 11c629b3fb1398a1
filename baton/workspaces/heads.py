"""Thread heads: per thread, its workspace spec, agent session and snapshot, turn by turn.

Pure: no I/O. The store (:class:`~baton.workspaces.WorkspaceStore`) keeps one head per
thread in a KV bucket and replaces it under the transcript fence
(:mod:`baton.log._transcript_fence`): the head's ``writer`` is the run that saved it.

Stored value (JSON)::

    {"writer": {"run", "epoch", "at"}, "workspace": {...}, "agent": "claude",
     "session": "<agent session id>" | null, "snapshot": "<digest>" | null,
     "turns": {"<run id>": {"snapshot", "session", "messages", "at"}, ...},
     "forked_from": {"thread", "run", "messages"} | null, "updated_at": <seconds>, "tenant": "<tenant>"}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from baton.log._transcript_fence import TranscriptWriter

#: Turn records a head keeps (the oldest go first).
MAX_TURNS = 100


@dataclass(frozen=True)
class TurnRecord:
    """What one run left: its snapshot, the agent session after it, the transcript length.

    Attributes:
        snapshot: the snapshot digest taken at the run's end (``None``: none was taken).
        agent_session_id: the agent's session id after the run (``None``: unknown).
        messages: the transcript's length (messages) at the run's end.
        at: when it was saved, seconds since the epoch.
    """

    snapshot: str | None
    agent_session_id: str | None
    messages: int
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot, "session": self.agent_session_id, "messages": self.messages, "at": self.at}

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> "TurnRecord":
        return cls(v.get("snapshot"), v.get("session"), int(v.get("messages") or 0), float(v.get("at") or 0))


@dataclass(frozen=True)
class ForkedFrom:
    """The thread and run a forked thread started from.

    Attributes:
        messages: how many messages of the source's transcript the fork started with (its
            run's turn record's ``messages``; ``0`` in heads saved before it was kept).
    """

    thread_id: str
    run_id: str
    messages: int = 0


@dataclass(frozen=True)
class ThreadHead:
    """A thread's session: where its next run starts.

    Attributes:
        workspace: the caller's workspace spec (a JSON object; never secrets).
        agent_kind: the agent kind (``"claude"``, ``"codex"``, ...).
        agent_session_id: the agent session the next run resumes (``None``: a fresh one).
        snapshot: the snapshot the next run restores (``None``: an empty workspace).
        turns: run id -> its :class:`TurnRecord`, oldest first, at most :data:`MAX_TURNS`.
        forked_from: the source of a forked thread, else ``None``.
        updated_at: the last save, seconds since the epoch.
        writer: who saved it (``None``: a value without one; anyone may replace it).
        tenant: the tenant the thread belongs to (``""``: no authentication); a fork
            belongs to its source's tenant, so no other tenant may start its first run.
    """

    workspace: dict[str, Any]
    agent_kind: str
    agent_session_id: str | None = None
    snapshot: str | None = None
    turns: dict[str, TurnRecord] = field(default_factory=dict)
    forked_from: ForkedFrom | None = None
    updated_at: float = 0.0
    writer: TranscriptWriter | None = None
    tenant: str = ""
    #: A turn whose end could not be snapshotted (``{"run", "reason"}``): the next run starts
    #: from the head's snapshot and session as they were, and says so; ``None`` otherwise.
    lost: dict[str, str] | None = None

    def snapshots(self) -> set[str]:
        """Every snapshot this head keeps alive: its own and its turns'."""
        out = {t.snapshot for t in self.turns.values() if t.snapshot}
        if self.snapshot:
            out.add(self.snapshot)
        return out

    def encode(self) -> bytes:
        doc = {
            "writer": self.writer.to_json() if self.writer is not None else None,
            "workspace": self.workspace,
            "agent": self.agent_kind,
            "session": self.agent_session_id,
            "snapshot": self.snapshot,
            "turns": {r: t.to_json() for r, t in self.turns.items()},
            "forked_from": ({"thread": self.forked_from.thread_id, "run": self.forked_from.run_id,
                             "messages": self.forked_from.messages}
                            if self.forked_from is not None else None),
            "updated_at": self.updated_at,
            "tenant": self.tenant,
            "lost": self.lost,
        }
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "ThreadHead":
        """Parse a stored head.

        Raises:
            ValueError: not a head (malformed JSON or fields).
        """
        try:
            doc = json.loads(raw)
            ff = doc.get("forked_from")
            return cls(
                workspace=dict(doc.get("workspace") or {}),
                agent_kind=str(doc.get("agent") or ""),
                agent_session_id=doc.get("session"),
                snapshot=doc.get("snapshot"),
                turns={str(r): TurnRecord.from_json(t) for r, t in (doc.get("turns") or {}).items()},
                forked_from=ForkedFrom(str(ff["thread"]), str(ff["run"]), int(ff.get("messages") or 0)) if ff else None,
                updated_at=float(doc.get("updated_at") or 0),
                writer=TranscriptWriter.from_json(doc.get("writer")),
                tenant=str(doc.get("tenant") or ""),
                lost=dict(doc["lost"]) if isinstance(doc.get("lost"), dict) else None,
            )
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a thread head: {type(exc).__name__}") from exc


def with_turn(
    head: ThreadHead | None, *, run_id: str, turn: TurnRecord, workspace: dict[str, Any], agent_kind: str,
    writer: TranscriptWriter, max_turns: int = MAX_TURNS, tenant: str | None = None,
) -> ThreadHead:
    """The head after a run's turn: its snapshot and session become the thread's, its record
    is the newest (a run saving again replaces its record), the oldest records beyond
    ``max_turns`` are dropped. ``forked_from`` is kept.
    """
    turns = dict(head.turns) if head is not None else {}
    turns.pop(run_id, None)
    turns[run_id] = turn
    while len(turns) > max_turns:
        turns.pop(next(iter(turns)))
    return ThreadHead(
        workspace=dict(workspace), agent_kind=agent_kind, agent_session_id=turn.agent_session_id,
        snapshot=turn.snapshot, turns=turns, forked_from=head.forked_from if head is not None else None,
        updated_at=turn.at, writer=writer,
        tenant=tenant if tenant is not None else (head.tenant if head is not None else ""),
    )


def forked(source: ThreadHead, *, source_thread: str, run_id: str, writer: TranscriptWriter, now: float) -> ThreadHead:
    """A new thread's head that starts where ``source``'s run ``run_id`` left off.

    Raises:
        KeyError: ``source`` keeps no turn record of ``run_id``.
    """
    turn = source.turns[run_id]
    return replace(
        source, agent_session_id=turn.agent_session_id, snapshot=turn.snapshot, turns={}, lost=None,
        forked_from=ForkedFrom(source_thread, run_id, turn.messages), updated_at=now, writer=writer,
    )
