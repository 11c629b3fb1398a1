"""The checker against hand-made histories: a clean one holds, and each property is
caught by a history that breaks it (and only it)."""
from __future__ import annotations

import copy

import pytest

from tests.nemesis.checker import History, ReaderHistory, Record, RunHistory, Violation, check, tally, \
    unhandled_lines

pytestmark = pytest.mark.unit

T1 = [{"id": "u1", "role": "user", "content": "one"}, {"id": "a1", "role": "assistant", "content": "A"}]
T2 = [*T1, {"id": "u2", "role": "user", "content": "two"}, {"id": "a2", "role": "assistant", "content": "B"}]


def _run(run_id: str = "r1", thread: str = "t1", turn: int = 0, transcript: list | None = None) -> RunHistory:
    stored = [Record(1, "chunk", 1, "host", "s", f"{run_id}/1/0"), Record(2, "chunk", 1, "journal", "a", f"{run_id}/1/1"),
              Record(3, "chunk", 1, "journal", "b", f"{run_id}/1/2"), Record(4, "close", 1, msg_id=f"{run_id}/1/c")]
    items = [("1", "s"), ("2", "a"), ("3", "b")]
    return RunHistory(run_id, thread, turn, ["a", "b"], "completed", transcript or T1, stored,
                      [ReaderHistory(list(items), live=True, ended=True)], list(items), "completed")


def _clean() -> History:
    return History([_run()], {"t1": T1})


def _props(h: History) -> set[str]:
    return {v.prop for v in check(h)}


def test_a_clean_history_holds() -> None:
    assert check(_clean()) == []
    assert set(tally([]).values()) == {0}


def test_a_takeover_with_a_fence_holds() -> None:
    h = _clean()
    r = h.runs[0]
    r.stored = r.stored[:2] + [Record(3, "fence", 2, msg_id="r1/2/f"), Record(4, "chunk", 2, "journal", "b", "r1/2/0"),
                               Record(5, "close", 2, msg_id="r1/2/c")]
    r.readers[0].items = r.fresh = [("1", "s"), ("2", "a"), ("4", "b")]
    assert check(h) == []


def test_a_duplicate_to_a_reader() -> None:
    h = _clean()
    h.runs[0].readers[0].items.insert(2, ("2", "a"))
    assert _props(h) == {"reader_once_in_order"}


def test_a_reader_out_of_order() -> None:
    h = _clean()
    items = h.runs[0].readers[0].items
    items[1], items[2] = items[2], items[1]
    assert _props(h) == {"reader_once_in_order"}


def test_a_live_reader_that_missed_a_chunk_or_the_end() -> None:
    h = _clean()
    del h.runs[0].readers[0].items[1]
    assert _props(h) == {"reader_once_in_order"}
    h = _clean()
    h.runs[0].readers[0].ended = False
    assert _props(h) == {"reader_once_in_order"}


def test_a_detached_reader_may_stop_early_but_not_get_other_chunks() -> None:
    h = _clean()
    h.runs[0].readers.append(ReaderHistory([("1", "s")], live=False))
    assert check(h) == []
    h.runs[0].readers[1].items = [("1", "x")]
    assert _props(h) == {"reader_once_in_order"}


def test_a_lower_epoch_after_a_higher_fence() -> None:
    h = _clean()
    h.runs[0].stored.insert(1, Record(9, "fence", 2, msg_id="r1/2/f"))
    assert _props(h) == {"log_fence"}


def test_a_duplicate_message_id() -> None:
    h = _clean()
    h.runs[0].stored[2].msg_id = h.runs[0].stored[1].msg_id
    assert _props(h) == {"log_unique_ids"}


def test_two_closes_or_none_or_not_last() -> None:
    for stored in ([*_run().stored, Record(5, "close", 1, msg_id="x")], _run().stored[:-1]):
        h = _clean()
        h.runs[0].stored = stored
        assert "log_one_close" in _props(h)


def test_stored_chunks_unlike_the_replay() -> None:
    h = _clean()
    h.runs[0].reference = ["a", "c"]
    assert _props(h) == {"replay_equal"}


def test_a_fresh_read_unlike_the_log() -> None:
    h = _clean()
    h.runs[0].fresh = h.runs[0].fresh[:2]
    assert _props(h) == {"fresh_read"}


def test_a_run_that_never_ends_or_ends_wrong() -> None:
    h = _clean()
    h.runs[0].status = "running"
    assert _props(h) == {"run_ends"}
    h.runs[0].status = "failed"
    assert _props(h) == {"run_ends"}


def test_a_saved_transcript_unlike_the_last_turn() -> None:
    h = _clean()
    h.transcripts["t1"] = T1[:1]
    assert _props(h) == {"transcript"}


def test_an_earlier_turn_saved_over_a_later_one() -> None:
    h = History([_run("r1", turn=0, transcript=T1), _run("r2", turn=1, transcript=T2)], {"t1": T1})
    assert _props(h) == {"thread_order"}
    h.transcripts["t1"] = T2
    assert check(h) == []


def test_an_acknowledged_cancel_that_completed() -> None:
    h = _clean()
    h.runs[0].cancel_acked = True
    assert _props(h) == {"cancel_honoured"}  # the log at the 202 was not read: cancelled is required
    h.runs[0].status = "cancelled"
    assert check(h) == []


def test_a_cancel_acknowledged_after_the_end_was_stored_keeps_the_outcome() -> None:
    """The log read right after the 202 already held the run's end (its terminal chunk, or
    the close): the flag may have landed after it, a fair race the run's end won."""
    h = _clean()
    r = h.runs[0]
    r.cancel_acked, r.cancel_acked_at, r.ack_journal, r.ack_log_ended = True, 12.5, 2, True
    assert check(h) == []


def test_a_cancel_ignored_while_the_agent_kept_producing_output() -> None:
    """The log read right after the 202 was open and held 1 of the 2 agent chunks: the end
    was stored after the flag landed, so a completed run ignored the cancel."""
    h = _clean()
    r = h.runs[0]
    r.cancel_acked, r.cancel_acked_at, r.ack_journal, r.ack_log_ended = True, 12.5, 1, False
    (v,) = check(h)
    assert v.prop == "cancel_honoured" and "1 of 2 agent chunks" in v.detail and "completed" in v.detail
    r.status = "aborted"
    r.reference = ["a", "b", "c"]  # a cancelled run stores a prefix of its replay
    assert check(h) == []


def test_the_ack_fields_survive_a_saved_history() -> None:
    h = _clean()
    r = h.runs[0]
    r.cancel_acked, r.cancel_acked_at, r.ack_journal, r.ack_log_ended = True, 3.0, 1, False
    back = History.from_json(copy.deepcopy(h.to_json()))
    assert back.runs[0].ack_log_ended is False and back.runs[0].ack_journal == 1
    assert _props(back) == {"cancel_honoured"}


def test_a_cancelled_run_keeps_a_prefix_of_the_replay() -> None:
    h = _clean()
    r = h.runs[0]
    r.cancel_acked, r.status, r.reference = True, "cancelled", ["a", "b", "c"]
    assert check(h) == []
    r.reference = ["x", "b", "c"]
    assert _props(h) == {"replay_equal"}


def test_a_cancel_sent_without_an_answer_may_end_either_way() -> None:
    h = _clean()
    h.runs[0].cancel_sent = True
    assert check(h) == []
    h.runs[0].status, h.runs[0].reference = "aborted", ["a", "b", "c"]
    assert check(h) == []


def test_a_start_past_the_grace_may_be_aborted_but_not_a_quick_one() -> None:
    h = _clean()
    r = h.runs[0]
    r.status, r.reference, r.start_wait = "aborted", ["a", "b", "c"], 75.0
    h.transcripts["t1"] = None
    assert check(h) == []
    r.start_wait = 2.0
    assert _props(h) == {"replay_equal", "run_ends", "transcript"}


def test_leaks() -> None:
    h = _clean()
    h.sandboxes_left, h.agents_left, h.claims_left = ["r1"], ["123 r1"], ["r1"]
    vs = check(h)
    assert {v.prop for v in vs} == {"no_leak"} and len(vs) == 3
    assert tally(vs)["no_leak"] == 3


def test_an_exception_that_escaped_a_service() -> None:
    log = ("2026-12-04 09:07:59,282 ERROR baton.aio: gateway: background task unregister-reader:r1 failed\n"
           "2026-12-04 09:07:59,295 ERROR uvicorn.error: Exception in ASGI application [run_id=r1]\n"
           "2026-12-04 09:07:59,300 WARNING gateway.queue: queue sweep failed\n"
           "2026-12-04 09:07:59,301 ERROR sandbox_host.driver: run r1: driver failed\n")
    h = _clean()
    h.unhandled = unhandled_lines("gateway.log", log)
    assert len(h.unhandled) == 2 and h.unhandled[0].startswith("gateway.log: ")
    assert _props(h) == {"no_unhandled_error"}


def test_a_history_survives_json() -> None:
    h = History([_run("r1", turn=0, transcript=T1), _run("r2", turn=1, transcript=T2)], {"t1": T2})
    h.runs[0].readers.append(ReaderHistory([("1", "s")], live=False))
    h.unhandled = ["gateway.log: x"]
    back = History.from_json(copy.deepcopy(h.to_json()))
    assert back == h
    assert str(Violation("no_leak", "r", "x")) == "[no_leak] r: x"


def test_an_answer_delivered_twice_lost_or_unasked() -> None:
    ok = _clean()
    ok.runs[0].answers, ok.runs[0].answer_deliveries = ["ap1"], ["ap1"]
    assert check(ok) == []
    for answers, deliveries in ((["ap1"], ["ap1", "ap1"]), (["ap1"], []), ([], ["ap1"])):
        h = _clean()
        h.runs[0].answers, h.runs[0].answer_deliveries = answers, deliveries
        assert _props(h) == {"answer_once"}
    h = _clean()  # a run cancelled before its agent read the answer: not lost
    h.runs[0].answers, h.runs[0].status, h.runs[0].cancel_sent = ["ap1"], "aborted", True
    assert "answer_once" not in _props(h)


def _asked(h: History) -> RunHistory:
    """``h``'s run, which asked ``ap1`` and ``ap2``, both answered and delivered once."""
    r = h.runs[0]
    r.asked, r.answers, r.answer_deliveries, r.awaiting_at_end = ["ap1", "ap2"], ["ap1", "ap2"], ["ap1", "ap2"], False
    return r


def test_approvals_answered_once_hold() -> None:
    h = _clean()
    _asked(h).duplicate_answers = [("ap1", 409, "APPROVAL_ALREADY_ANSWERED")]
    assert check(h) == []


def test_a_double_delivery_fails() -> None:
    """The relay passing one answer twice: the log holds its activity and a redelivery."""
    h = _clean()
    _asked(h).answer_deliveries = ["ap1", "ap2", "ap1"]
    [v] = check(h)
    assert v.prop == "answer_once" and "ap1 delivered 2 times" in v.detail


def test_a_second_answer_taken_fails() -> None:
    h = _clean()
    _asked(h).duplicate_answers = [("ap2", 200, "")]
    assert _props(h) == {"answer_once"}


def test_a_question_asked_and_never_answered_in_a_completed_run_fails() -> None:
    h = _clean()
    r = _asked(h)
    r.answers, r.answer_deliveries = ["ap1"], ["ap1"]
    assert [v.detail for v in check(h)] == ["question ap2 asked, the run completed without its answer"]


def test_a_question_left_open_by_a_cancel_is_closed() -> None:
    h = _clean()
    r = _asked(h)
    r.status, r.cancel_acked, r.ack_log_ended = "cancelled", True, False
    r.answers, r.answer_deliveries, r.unanswered = ["ap1"], ["ap1"], ["ap2"]
    r.late_answers = [("ap2", 409, "RUN_ENDED")]
    h.runs[0].stored = r.stored[:2] + r.stored[3:]  # cancelled after its first agent chunk
    r.fresh = r.readers[0].items = [("1", "s"), ("2", "a")]
    assert check(h) == []
    for late in ([("ap2", 200, "")], [("ap2", 409, "APPROVAL_ALREADY_ANSWERED")]):
        r.late_answers = late
        assert _props(h) == {"answer_once"}
    r.late_answers, r.awaiting_at_end = [("ap2", 409, "RUN_ENDED")], True
    assert _props(h) == {"answer_once"}
    r.awaiting_at_end, r.answer_deliveries = False, ["ap1", "ap2"]  # the open one reached the agent
    assert _props(h) == {"answer_once"}


def test_approval_fields_survive_json() -> None:
    h = _clean()
    r = _asked(h)
    r.duplicate_answers, r.late_answers, r.unanswered = [("ap1", 409, "X")], [("ap2", 409, "RUN_ENDED")], ["ap2"]
    assert History.from_json(copy.deepcopy(h.to_json())) == h
