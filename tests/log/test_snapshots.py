"""Snapshot records in the log (real NATS): written by the fenced writer on ``<run>.~snap``,
never seen by plain reads, fenced by the epoch, and the same bytes after a takeover."""
from __future__ import annotations

import json
from typing import Any

import pytest

from baton.errors import LogUnavailable, RunClaimLost
from baton.log import DeliveryLog, LogConfig, latest_snapshot, snapshot_subject
from baton.log import _snapshots
from baton.log.snapshot import Snapshot, decode, encode, replay
from tests.conftest import unique
from tests.log.conftest import unique_cfg

pytestmark = pytest.mark.timeout(120)


def turn(n: int) -> list[dict[str, Any]]:
    """One assistant turn: a text message, a tool call and its result (quiet at its end)."""
    m, t = f"m{n}", f"t{n}"
    return [
        {"type": "TEXT_MESSAGE_START", "messageId": m, "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": m, "delta": f"Looking at file {n}. "},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": m, "delta": "Réading it now."},
        {"type": "TEXT_MESSAGE_END", "messageId": m},
        {"type": "TOOL_CALL_START", "toolCallId": t, "toolCallName": "Read", "parentMessageId": m},
        {"type": "TOOL_CALL_ARGS", "toolCallId": t, "delta": json.dumps({"path": f"/src/f{n}.py"})},
        {"type": "TOOL_CALL_END", "toolCallId": t},
        {"type": "TOOL_CALL_RESULT", "toolCallId": t, "messageId": f"r{n}", "content": "x = 1\n" * n},
    ]


def run_chunks(turns: int) -> list[dict[str, Any]]:
    return [{"type": "RUN_STARTED", "threadId": "th", "runId": "r"}] + [c for n in range(turns) for c in turn(n)]


@pytest.fixture
async def slog(nc: Any) -> Any:
    """A delivery log whose snapshots are due every 10 chunks or 1500 bytes, in parts of 700 bytes."""
    log = DeliveryLog(nc, unique_cfg(snapshot_chunks=10, snapshot_bytes=1500, snapshot_part_bytes=700))
    await log.provision()
    yield log
    await nc.jetstream().delete_stream(log.cfg.stream)
    await nc.jetstream().delete_key_value(log.cfg.bucket)


async def stored(log: DeliveryLog, run_id: str) -> list[tuple[int, dict[str, Any], int]]:
    out = []
    async with log.read(run_id, "-1") as r:
        async for offset, chunk in r:
            out.append((int(offset), chunk, len(json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode())))
    return out


async def stored_snapshots(nc: Any, cfg: LogConfig, run_id: str) -> list[Snapshot]:
    """Every complete snapshot stored for the run, in order (parts joined)."""
    js = nc.jetstream()
    sub = await js.subscribe(snapshot_subject(cfg, run_id), ordered_consumer=True)
    info = await js.stream_info(cfg.stream, subjects_filter=snapshot_subject(cfg, run_id))
    total = sum((info.state.subjects or {}).values())
    parts: list[bytes] = []
    out: list[Snapshot] = []
    for _ in range(total):
        msg = await sub.next_msg(timeout=10)
        parts.append(msg.data)
        i, _, n = msg.headers["Baton-Snap-Part"].partition("/")
        if i == n:
            out.append(decode(b"".join(parts[-int(n):])))
    await sub.unsubscribe()
    return out


async def test_the_writer_stores_the_rule_s_snapshots_and_plain_reads_never_see_them(nc: Any, slog: DeliveryLog) -> None:
    run_id = unique("run")
    w = slog.writer(run_id, 1)
    await w.fence()
    chunks = run_chunks(12)
    for i in range(0, len(chunks), 7):
        await w.append(chunks[i:i + 7])
    assert await w.close("completed")
    log = await stored(slog, run_id)
    assert [c for _, c, _ in log] == chunks  # a plain read: chunks only
    kinds = [r.kind for r in await slog.stored_headers(run_id)]
    assert kinds == ["fence"] + ["chunk"] * len(chunks) + ["close"]
    want = replay(log, slog.cfg.snapshot_policy, closed=True)
    got = await stored_snapshots(nc, slog.cfg, run_id)
    assert [encode(s) for s in got] == [encode(s) for s in want]
    assert len(want) > 3 and any(len(encode(s)) > 700 for s in want)  # several, some in parts
    found = await latest_snapshot(nc, slog.cfg, run_id)
    assert found is not None and found[0] == want[-1] and found[0].offset == log[-1][0]


async def test_a_fenced_out_writer_stores_no_snapshot_and_latches(nc: Any, slog: DeliveryLog) -> None:
    run_id = unique("run")
    w1 = slog.writer(run_id, 1)
    await w1.fence()
    chunks = run_chunks(3)
    await w1.append(chunks[:17])  # one due point passed: snapshot 1 stored
    before = await latest_snapshot(nc, slog.cfg, run_id)
    assert before is not None
    w2 = slog.writer(run_id, 2)
    await w2.fence()
    # w1 does not know yet; its next chunk is refused, so its snapshot never comes.
    with pytest.raises(RunClaimLost):
        await w1.append(chunks[17:])
    assert await latest_snapshot(nc, slog.cfg, run_id) == before
    # A snapshot part fenced on a stale head is refused by JetStream itself.
    with pytest.raises(_snapshots.SnapshotFenced):
        await _snapshots.store(nc, slog.cfg, run_id, 1, before[0], head=before[0].offset, prev=before[1],
                               part_bytes=700, timeout=5)


@pytest.mark.parametrize("handed", [False, True], ids=["read", "handed"])
@pytest.mark.parametrize("predecessor_snapshots", [True, False], ids=["stored", "died-before-storing"])
async def test_a_successor_between_two_snapshots_writes_the_same_snapshots(
        nc: Any, slog: DeliveryLog, predecessor_snapshots: bool, handed: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Takeover between two snapshots. ``died-before-storing``: the predecessor stored none of
    its due snapshots (it stopped between a chunk and its snapshot); the successor stores the
    latest due one when it primes, byte for byte what an undisturbed run stores. ``handed``:
    the successor's takeover read (``stored_before_fence``) hands the writer the stored
    chunks, and the prime reads none of them again."""
    chunks = run_chunks(10)
    # The undisturbed run.
    calm = unique("calm")
    w = slog.writer(calm, 1)
    await w.fence()
    await w.append(chunks)
    await w.close("completed")
    calm_snaps = await stored_snapshots(nc, slog.cfg, calm)

    run_id = unique("run")
    first_cfg = slog.cfg if predecessor_snapshots else LogConfig(**{**slog.cfg.__dict__, "snapshot_chunks": 0,
                                                                    "snapshot_bytes": 0})
    w1 = DeliveryLog(nc, first_cfg).writer(run_id, 1)
    await w1.fence()
    cut = 45  # between two due points of the rule
    await w1.append(chunks[:cut])
    w2 = slog.writer(run_id, 2)
    await w2.fence()
    reads: list[tuple[int, int]] = []
    real_between = _snapshots.chunks_between

    async def observed_between(nc_: Any, cfg: LogConfig, run: str, after: int, up_to: int, **kw: Any) -> Any:
        reads.append((after, up_to))
        return await real_between(nc_, cfg, run, after, up_to, **kw)

    monkeypatch.setattr(_snapshots, "chunks_between", observed_between)
    if handed:
        assert w2.fenced_over is not None
        records, bodies = await slog.stored_before_fence(run_id, w2.fenced_over)
        w2.take_stored_chunks([(r.offset, bodies[r.offset]) for r in records if r.kind == "chunk"])
    await w2.append(chunks[cut:])
    await w2.close("completed")
    assert (reads == []) if handed else len(reads) == 1

    log = await stored(slog, run_id)
    assert [c for _, c, _ in log] == chunks
    got = await stored_snapshots(nc, slog.cfg, run_id)
    want = replay(log, slog.cfg.snapshot_policy, closed=True)
    if predecessor_snapshots:
        assert [encode(s) for s in got] == [encode(s) for s in want]
    else:
        # The successor's first snapshot is the latest due one before its fence.
        before = [s for s in want if s.offset <= log[cut - 1][0]]
        assert len(before) >= 2
        assert [encode(s) for s in got] == [encode(s) for s in [before[-1]] + want[len(before):]]
    # Same content as the undisturbed run's (the offsets differ by the fence record).
    assert [(s.chunks, s.events) for s in got] == [(s.chunks, s.events) for s in calm_snaps[-len(got):]]


async def test_a_successor_s_first_chunks_land_before_it_reads_the_stored_log(
        nc: Any, slog: DeliveryLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """A successor learns the snapshot state of what its predecessor stored (reads of the
    log) only once its first batch landed: a reader's first chunk after a takeover does not
    wait for them. A read that fails then loses nothing: the batch stays, the next append
    reads again, and the snapshots are those of an undisturbed run."""
    chunks = run_chunks(10)
    run_id = unique("run")
    w1 = slog.writer(run_id, 1)
    await w1.fence()
    cut = 45
    await w1.append(chunks[:cut])

    heads_at_read: list[int] = []
    failures = [True]  # the first read fails, as a JetStream that did not answer
    real_latest = _snapshots.latest

    async def observed_latest(*args: Any, **kwargs: Any) -> Any:
        heads_at_read.append(sum(1 for h in await slog.stored_headers(run_id) if h.kind == "chunk"))
        if failures and failures.pop():
            raise LogUnavailable(run_id, "reading the snapshot failed: TimeoutError")
        return await real_latest(*args, **kwargs)

    monkeypatch.setattr(_snapshots, "latest", observed_latest)
    w2 = slog.writer(run_id, 2)
    await w2.fence()
    first = await w2.append(chunks[cut:cut + 3])
    assert len(first) == 3  # landed though the read after it failed
    assert heads_at_read == [cut + 3]  # read only after the batch was stored
    await w2.append(chunks[cut + 3:])
    assert heads_at_read == [cut + 3, len(chunks)]
    await w2.close("completed")

    log = await stored(slog, run_id)
    assert [c for _, c, _ in log] == chunks
    got = await stored_snapshots(nc, slog.cfg, run_id)
    want = replay(log, slog.cfg.snapshot_policy, closed=True)
    assert [encode(s) for s in got] == [encode(s) for s in want]
