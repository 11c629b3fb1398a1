"""The kept chunks a window of a snapshot's newest messages serves (gateway/_kept.py): those
that came with the window's messages whole, of the older ones the state they leave; the
positions the snapshot rule records for them survive a takeover (a primed writer)."""
from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from baton.log.snapshot import KEPT, SnapshotPolicy, SnapshotState, decode, encode, kept_kind, replay
from hypothesis import given, settings, strategies as st

from gateway._kept import LATEST, MOMENT, KeptIndex, index_of, served, served_indices
from gateway._snapshots import served_of

pytestmark = pytest.mark.unit

GOLDEN = sorted((pathlib.Path(__file__).parents[1] / "sandbox" / "golden").glob("*.json"))


def _index(kinds_at: list[tuple[str, int]]) -> KeptIndex:
    return KeptIndex(0, tuple(a for _, a in kinds_at), tuple(k for k, _ in kinds_at))


def test_older_kept_chunks_leave_their_state_and_newer_ones_are_served_whole() -> None:
    index = _index([
        ("CUSTOM:claude.init", 1), ("CUSTOM:turn.usage", 2), ("CUSTOM:claude.result", 3),   # older
        ("SUBAGENT_STARTED:a", 3), ("SUBAGENT_END:a", 4),                                  # older, ended
        ("SUBAGENT_STARTED:b", 4),                                                         # older, running
        ("CUSTOM:approval-requested", 4), ("RAW", 4), ("CUSTOM:some.new.name", 4),         # older, unknown
        ("CUSTOM:claude.init", 5), ("CUSTOM:agent.compaction", 5),                         # older
        ("CUSTOM:claude.init", 10), ("CUSTOM:turn.usage", 11), ("SUBAGENT_END:b", 12),    # in the window
    ])
    assert served(index, 10) == [False, False, True, False, False, True, True, True, True, False, False,
                                 True, True, True]
    # No window (first 0): every one.
    assert served(index, 0) == [True] * 14


_KINDS = [f"CUSTOM:{n}" for n in sorted(LATEST | MOMENT)] + [
    "CUSTOM:approval-requested", "RAW", "ACTIVITY_DELTA", "CUSTOM:some.new.name",
    "SUBAGENT_STARTED:a", "SUBAGENT_END:a", "SUBAGENT_STARTED:b", "SUBAGENT_END:b"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_KINDS), st.integers(0, 30)), max_size=60), st.integers(0, 32),
       st.booleans())
def test_the_fast_answer_is_the_rule_itself(kinds_at: list[tuple[str, int]], first: int, ordered: bool) -> None:
    # Positions in log order only grow; out of order (never written) the rule itself answers.
    if ordered:
        kinds_at = [(k, a) for k, (_, a) in zip((k for k, _ in kinds_at), sorted(kinds_at, key=lambda x: x[1]))]
    index = _index(kinds_at)
    assert served_indices(index, first) == [i for i, keep in enumerate(served(index, first)) if keep]


def test_a_malformed_head_has_no_index() -> None:
    good = {"keptLine": 2, "keptAt": [0, 1], "keptKind": [0, 1], "keptKinds": ["RAW", "CUSTOM:x"],
            "keptFrom": 10, "keptLens": [3, 4]}
    index = index_of(good)
    assert index is not None and index.starts() == [10, 14, 19] and index.kind == ("RAW", "CUSTOM:x")
    for key, bad in (("keptAt", [0, "1"]), ("keptKind", [0, 2]), ("keptKind", [-1, 0]), ("keptKinds", ["RAW", 1]),
                     ("keptAt", [0])):
        assert index_of({**good, key: bad}) is None, (key, bad)
    assert index_of({**good, "keptLens": [3, -1]}) == KeptIndex(2, (0, 1), ("RAW", "CUSTOM:x"))


def _golden_log(repeat: int) -> list[tuple[int, dict[str, Any], int]]:
    """The golden chunks repeated with fresh ids (as bench/long_run.py), as a stored log."""
    body: list[dict[str, Any]] = []
    for path in GOLDEN:
        data = json.loads(path.read_text())
        chunks = data["chunks"] if isinstance(data, dict) else data
        body += [c for c in chunks if c.get("type") not in ("RUN_STARTED", "RUN_FINISHED", "RUN_ERROR")]
    out: list[dict[str, Any]] = [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}]
    for cycle in range(repeat):
        for c in body:
            c2 = dict(c)
            for k in ("messageId", "toolCallId", "parentMessageId", "subagentRunId"):
                if isinstance(c2.get(k), str):
                    c2[k] = f"{c2[k]}~{cycle}"
            out.append(c2)
    out.append({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"})
    return [(i + 1, c, len(json.dumps(c, separators=(",", ":")).encode())) for i, c in enumerate(out)]


def test_a_window_of_a_long_run_serves_the_state_of_its_older_notices_not_each_one() -> None:
    log = _golden_log(4)
    snap = replay(log, SnapshotPolicy(0, 0), closed=True)[-1]
    body = encode(snap)
    assert decode(body).kept_at == snap.kept_at is not None
    whole = served_of(body)
    window = [json.loads(e) for e in whole.window(20).events]
    value = window[1]["value"]
    kept = [ev for ev in snap.events if ev["type"] in KEPT]
    assert value["eventsOmitted"] > len(kept) // 2  # most of the notices were about older moments
    served_kept = [ev for ev in window if ev.get("type") in KEPT and ev.get("name") != "snapshot.window"]
    assert len(served_kept) == len(kept) - value["eventsOmitted"]
    # What each notice leaves is there: the last of every LATEST name is the run's last.
    for name in LATEST:
        mine = [ev for ev in kept if ev["type"] == "CUSTOM" and ev["name"] == name]
        theirs = [ev for ev in served_kept if ev["type"] == "CUSTOM" and ev["name"] == name]
        assert (mine[-1:] == theirs[-1:]) and len(theirs) <= len(mine)
    # The served ones keep their log order, and the newest messages, the state and the end are whole.
    it = iter(kept)
    assert all(any(ev == k for k in it) for ev in served_kept)  # a subsequence of the kept chunks
    assert window[2]["messages"] == snap.messages[-20:] and window[-1] == snap.events[-1]
    # A window as wide as the run leaves nothing out.
    full = [json.loads(e) for e in whole.window(len(snap.messages)).events]
    assert full[1]["value"]["eventsOmitted"] == 0 and full[3:] == list(snap.events[2:])


def test_kept_positions_survive_a_primed_writer_and_unknown_ones_stay_unknown() -> None:
    log = _golden_log(2)
    policy = SnapshotPolicy(200, 0)
    snaps = replay(log, policy, closed=True)
    assert len(snaps) > 2
    mid = snaps[len(snaps) // 2]
    primed = SnapshotState.restore(policy, decode(mid.body))
    rest = [(o, c, s) for o, c, s in log if o > mid.offset]
    again = []
    for o, c, s in rest:
        if primed.feed(o, c, s):
            again.append(primed.take())
    if primed.pending:
        again.append(primed.take())
    assert [s.body for s in again] == [s.body for s in snaps[snaps.index(mid) + 1:]]
    # A snapshot written before positions were recorded: its successor records none either.
    head, _, lines = mid.body.partition(b"\n")
    h = json.loads(head)
    for k in ("keptAt", "keptKind", "keptKinds", "keptLine"):
        del h[k]
    old = json.dumps(h, separators=(",", ":"), sort_keys=True).encode() + b"\n" + lines
    st = SnapshotState.restore(policy, decode(old))
    for o, c, s in rest:
        st.feed(o, c, s)
    assert st.take().kept_at is None
    assert served_of(old).kept is None  # and a window of it serves every kept chunk whole


def test_kept_kinds_name_what_the_fold_needs() -> None:
    assert kept_kind({"type": "CUSTOM", "name": "claude.init"}) == "CUSTOM:claude.init"
    assert kept_kind({"type": "SUBAGENT_ERROR", "subagentRunId": "s"}) == "SUBAGENT_END:s"
    assert kept_kind({"type": "SUBAGENT_STARTED", "subagentRunId": "s"}) == "SUBAGENT_STARTED:s"
    assert kept_kind({"type": "RAW"}) == "RAW"
