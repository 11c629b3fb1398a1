"""The transcript fence: a paused old host never replaces what a successor or a
later run of the thread saved. The rule is table-tested; the store applies it inside the
write on a real nats-server.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import nats as nats_py
import pytest
from nats.aio.client import Client as NATS

from baton.errors import TranscriptConflict, TranscriptFenced
from baton.log import LogConfig, TranscriptStore
from baton.log._transcript_fence import TranscriptWriter, may_replace, verdict
from baton.log._transcripts import thread_key
from baton_tools.testing.servers import NatsServer
from tests.conftest import unique

W = TranscriptWriter


@pytest.mark.parametrize("stored,writer,expected", [
    (None, W("r1", 1, 10.0), "replace"),                      # nothing saved / no identity
    (W("r1", 1, 10.0), W("r1", 1, 10.0), "replace"),          # its own earlier save
    (W("r1", 1, 10.0), W("r1", 2, 10.0), "replace"),          # a successor replaces the old epoch
    (W("r1", 2, 10.0), W("r1", 1, 10.0), "newer-epoch"),      # the paused old host wakes up
    (W("r1", 5, 10.0), W("r1", 4, 10.0), "newer-epoch"),
    (W("r0", 3, 5.0), W("r1", 1, 10.0), "replace"),           # a new run replaces the last run's
    (W("r2", 1, 20.0), W("r1", 3, 10.0), "later-run"),        # the old run's zombie after a new run
    (W("rb", 1, 10.0), W("ra", 1, 10.0), "later-run"),        # same start time: run id orders
    (W("ra", 1, 10.0), W("rb", 1, 10.0), "replace"),
    (W("r1", 3, 10.0), W("r1", 1, 90.0), "replace"),          # the id reused after retention
    (W("r1", 1, 90.0), W("r1", 3, 10.0), "later-run"),        # the old run's zombie after reuse
    # Numbered runs (RunRecord.thread_seq): the number orders them, never the clock.
    (W("r1", 1, 90.0, 1), W("r2", 1, 10.0, 2), "replace"),    # the next run, stamped by a slow clock
    (W("r2", 1, 10.0, 2), W("r1", 4, 90.0, 1), "later-run"),  # the earlier run's zombie, whatever its clock
    (W("r1", 2, 10.0, 1), W("r1", 1, 10.0, 1), "newer-epoch"),
    (W("r1", 1, 10.0, 1), W("r1", 2, 10.0, 1), "replace"),
    (W("r1", 3, 10.0, 1), W("r1", 1, 10.0, 7), "replace"),    # the id reused after retention: a new number
    (W("r0", 9, 99.0), W("r1", 1, 1.0, 1), "replace"),        # a run from before numbers comes first
    (W("r1", 1, 1.0, 1), W("r0", 9, 99.0), "later-run"),
    (W("", 0, 0.0), W("r1", 1, 5.0, 1), "replace"),           # a fork's transcript (no run)
])
def test_the_fence_rule(stored: TranscriptWriter | None, writer: TranscriptWriter, expected: str) -> None:
    assert verdict(stored, writer) == expected
    assert may_replace(stored, writer) is (expected == "replace")


@pytest.mark.parametrize("raw", [None, {}, {"run": "r"}, {"run": "r", "epoch": "x", "at": 1}, [1, 2]])
def test_a_missing_or_malformed_writer_is_no_writer(raw: Any) -> None:
    assert TranscriptWriter.from_json(raw) is None


@pytest.mark.parametrize("writer", [W("r", 2, 10.5), W("r", 2, 10.5, 3)])
def test_a_writer_round_trips_with_its_number(writer: TranscriptWriter) -> None:
    assert TranscriptWriter.from_json(writer.to_json()) == writer
    assert ("seq" in writer.to_json()) is bool(writer.seq)  # a run from before numbers is stored as before


@pytest.fixture
async def store(nats: NatsServer) -> AsyncIterator[tuple[TranscriptStore, NATS, LogConfig]]:
    nc = await nats_py.connect(servers=[nats.url])
    tag = unique("tf")
    cfg = LogConfig(stream=f"RUNS_{tag}", subject_prefix=f"t.{tag}", bucket=f"threads-{tag}")
    ts = TranscriptStore(nc, cfg, max_value_size=4096)
    await ts.provision()
    try:
        yield ts, nc, cfg
    finally:
        await nc.jetstream().delete_key_value(cfg.bucket)
        await nc.close()


def msgs(n: int, size: int = 10) -> list[dict[str, Any]]:
    return [{"id": f"m{i}", "role": "assistant" if i % 2 else "user", "content": "x" * size} for i in range(n)]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("size", [10, 400], ids=["inline", "parts"])
async def test_a_stale_epoch_never_replaces_a_successors_transcript(
        store: tuple[TranscriptStore, NATS, LogConfig], size: int) -> None:
    ts, _nc, _cfg = store
    thread = unique("thr-")
    old, new = W("r1", 1, 100.0), W("r1", 2, 100.0)
    rev1 = await ts.save(thread, msgs(3, size), writer=old)
    # the successor loads what the old host saved and saves the whole run
    _, rev = await ts.load(thread)
    assert rev == rev1
    rev2 = await ts.save(thread, msgs(31, size), expected_revision=rev, writer=new)
    # the old host wakes up: with its stale revision it conflicts; after reloading, it is fenced
    with pytest.raises(TranscriptConflict):
        await ts.save(thread, msgs(6, size), expected_revision=rev1, writer=old)
    with pytest.raises(TranscriptFenced) as fenced:
        await ts.save(thread, msgs(6, size), expected_revision=rev2, writer=old)
    assert (fenced.value.run_id, fenced.value.epoch) == ("r1", 1)
    assert (fenced.value.stored_run_id, fenced.value.stored_epoch) == ("r1", 2)
    assert await ts.load(thread) == (msgs(31, size), rev2)
    # a later run of the thread replaces it; the old run's zombie cannot
    rev3 = await ts.save(thread, msgs(40, size), expected_revision=rev2, writer=W("r2", 1, 200.0))
    with pytest.raises(TranscriptFenced):
        await ts.save(thread, msgs(6, size), expected_revision=rev3, writer=new)
    assert await ts.load(thread) == (msgs(40, size), rev3)


@pytest.mark.timeout(30)
async def test_a_value_saved_without_a_writer_stays_readable_and_replaceable(
        store: tuple[TranscriptStore, NATS, LogConfig]) -> None:
    ts, nc, cfg = store
    thread = unique("thr-")
    kv = await nc.jetstream().key_value(cfg.bucket)
    legacy = b'[{"id":"u1","role":"user","content":"hi"}]'  # the format before the fence
    rev = await kv.create(thread_key(thread), legacy)
    assert await ts.load(thread) == ([{"id": "u1", "role": "user", "content": "hi"}], rev)
    rev2 = await ts.save(thread, msgs(2), expected_revision=rev, writer=W("r1", 1, 1.0))
    assert await ts.load(thread) == (msgs(2), rev2)


@pytest.mark.timeout(30)
async def test_a_driver_whose_run_has_a_successor_stops_saving(store: tuple[TranscriptStore, NATS, LogConfig]) -> None:
    from types import SimpleNamespace

    from baton.v1 import runs_pb2
    from sandbox_host import machine as M
    from sandbox_host.deps import HostSettings
    from sandbox_host.driver import RunDriver

    ts, _nc, _cfg = store
    thread = unique("thr-")
    rec = runs_pb2.RunRecord(run_id=unique("run-"), thread_id=thread, started_at=100.0)
    deps: Any = SimpleNamespace(transcripts=ts, settings=HostSettings(), session=None)
    user = [{"id": "u1", "role": "user", "content": "hi"}]
    old = RunDriver(deps, rec, 1, "fresh", None, input_messages=user, fence_seq=1)  # type: ignore[arg-type]
    await old.claim_log.save_transcript()  # a snapshot of the first host
    # the successor (epoch 2) saves the whole run
    final = [*user, {"id": "a1", "role": "assistant", "content": "the whole answer"}]
    _, rev = await ts.load(thread)
    rev2 = await ts.save(thread, final, expected_revision=rev, writer=W(rec.run_id, 2, 100.0))
    # the first host wakes up with a stale view and saves again: refused, never retried
    old.claim_log.builder.feed({"type": "TEXT_MESSAGE_START", "messageId": "a0", "role": "assistant"})
    with pytest.raises(TranscriptFenced):
        await old.claim_log.save_transcript()
    with pytest.raises(TranscriptFenced):
        await old.claim_log.save_transcript()
    assert await ts.load(thread) == (final, rev2)
    assert old._control.get_nowait() == M.ClaimLost("transcript@2")  # the driver stops
