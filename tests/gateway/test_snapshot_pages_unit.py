"""The newest-messages window of a served snapshot and its pages, on record bodies alone
(gateway/_snapshots.py): sliced by the message ends the head records, or found by one parse
of a head written before they were recorded; the same bytes either way."""
from __future__ import annotations

import json

import pytest

from baton.errors import InvalidArgument
from baton.log.snapshot import Snapshot, decode, encode
from gateway._snapshots import served_of

pytestmark = pytest.mark.unit


def _snapshot(n: int) -> Snapshot:
    msgs = [{"id": "u", "role": "user", "content": "go, \"quoted\"\n and ünïcode"}] + [
        {"id": f"m{i}", "role": "assistant", "content": f"answer {i}", "toolCalls": [
            {"id": f"t{i}", "type": "function", "function": {"name": "Read", "arguments": "{\"p\": 1}"}}]}
        for i in range(n)]
    events = ({"type": "RUN_STARTED", "runId": "r", "threadId": "t"}, {"type": "MESSAGES_SNAPSHOT", "messages": msgs},
              {"type": "CUSTOM", "name": "run.accepted", "value": {}}, {"type": "RUN_FINISHED", "runId": "r"})
    return Snapshot(42, 99, events, 1)


def _old_body(snap: Snapshot) -> bytes:
    """The body as written before the head recorded message ends."""
    head, _, rest = encode(snap).partition(b"\n")
    h = json.loads(head)
    del h["msgEnds"]
    return json.dumps(h, separators=(",", ":"), sort_keys=True).encode() + b"\n" + rest


@pytest.mark.parametrize("old", [False, True], ids=["indexed", "parsed"])
def test_window_and_pages_give_every_message_once(old: bool) -> None:
    snap = _snapshot(9)
    body = _old_body(snap) if old else encode(snap)
    assert decode(body).events == snap.events  # the head's index changes nothing a reader decodes
    served = served_of(body)
    assert served.total == 10 and served.input_count == 1
    cut = served.window(3)
    events = [json.loads(e) for e in cut.events]
    assert [e["type"] for e in events] == ["RUN_STARTED", "CUSTOM", "MESSAGES_SNAPSHOT", "CUSTOM", "RUN_FINISHED"]
    value = events[1]["value"]
    assert value["messagesOmitted"] == 7 and value["totalMessages"] == 10 and value["inputMessages"] == 1
    assert value["snapshotOffset"] == "42" and events[2]["messages"] == snap.messages[-3:]
    got, cursor = [], value["cursor"]
    while cursor:
        msgs, start, cursor = served.page(3, cursor)
        got = [json.loads(m) for m in msgs] + got
    assert got + events[2]["messages"] == snap.messages
    whole = served.window(100)
    assert json.loads(whole.events[1])["value"]["cursor"] is None
    assert json.loads(whole.events[2]) == snap.events[1]
    with pytest.raises(InvalidArgument):
        served.page(3, "bm90LWEtY3Vyc29y")
    with pytest.raises(InvalidArgument):
        served_of(encode(_snapshot(2))).page(1, value["cursor"])  # another snapshot's position
