"""Two stores (two gateways, or two workers of one) writing and reading one Durable Stream on
a real nats-server: a view behind the other's writes catches up from its last sequence (the
same view, never folded again whole), with the record it heard and JetStream's ack of it,
heard too (no request to JetStream), and every read from either is whole and in order; with
a store whose acks go to its own inbox (an older gateway), by asking JetStream instead."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import signal
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats
import pytest

from nats.aio.msg import Msg

from gateway.durable_streams import _model as M
from gateway.durable_streams._protocol import Producer
from gateway.durable_streams._publish import Publisher
from gateway.durable_streams._model import StreamState
from gateway.durable_streams._store import CONFLICT_BUDGET, CONFLICT_TRIES, Conflict, StoreConfig, StreamStore
from baton_tools.testing.servers import NatsServer
from tests.conftest import assert_eventually, freeze, unique

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("b_acks", ["shared", "own inbox"])
async def test_a_view_catches_up_with_the_other_stores_writes_without_a_new_fold(nats: object, b_acks: str) -> None:
    url = nats.url  # type: ignore[attr-defined]
    # A catch-up waits as long as it takes for an ack it will hear: any get is then a miss.
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"), ack_wait=30.0)
    def acks(stores: list[StreamStore]) -> None:
        if b_acks == "own inbox":
            stores[1]._pub = _InboxPublisher(stores[1]._nc)

    async with started(url, cfg, prepare=acks) as ((a, b), watcher):
        gets = await counting(watcher, f"$JS.API.DIRECT.GET.{cfg.stream}")
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")
        view_b = await b.get(path)
        assert view_b is not None
        sent: list[bytes] = []
        for i in range(40):  # alternating writers, as a worker pair takes one client's appends
            if i == 2:
                await watcher.flush()
                gets.clear()  # from here on each store has heard the other's acks, if shared
            data = f"{i:03d}".encode()
            await (a if i % 2 == 0 else b).append(path, data, content_type="text/plain", seq=None,
                                                  producer=None, close=False)
            sent.append(data)
            for s in (a, b):  # the writer's at once; the other's once it heard of the write
                await assert_eventually(functools.partial(whole, s, path, list(sent)), timeout=30)
        assert await b.get(path) is view_b  # caught up in place: never dropped and folded anew
        await watcher.flush()
        if b_acks == "shared":
            assert gets == []  # every record heard was folded at its ack
        else:  # each view asked JetStream for each of the other's records (b hears no acks)
            assert len(gets) == 38
        # A reader waiting in one store wakes for a write through the other.
        st = await b.get(path)
        assert st is not None
        waiting = asyncio.create_task(b.wait(st, 30))
        await a.append(path, b"end", content_type="text/plain", seq=None, producer=None, close=True)
        assert await waiting

        async def b_has_it() -> bool:
            cur = await b.get(path)
            assert cur is not None and cur.closed and cur.messages[-1].data == b"end"
            return True

        await assert_eventually(b_has_it, timeout=30)


async def test_idempotent_producers_writing_through_both_stores_at_once_land_each_append_once(nats: object) -> None:
    """Three producers append at once, each append through either store at random, and
    every fourth sent again through the other (a client's retry after a lost answer): the
    stream holds each append once, each producer's in its order, and both stores' views
    are what a fresh fold of JetStream gives."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    conns = [await nats_connect(url) for _ in range(3)]
    stores = [StreamStore(nc, cfg) for nc in conns]
    a, b, fresh = stores
    verdicts: dict[str, int] = {}
    try:
        for s in stores:
            await s.start()
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")

        async def append(store: StreamStore, producer: Producer, data: bytes) -> None:
            while True:
                try:
                    _, _, verdict = await store.append(path, data, content_type="text/plain", seq=None,
                                                       producer=producer, close=False)
                except Conflict:
                    continue  # refused, nothing written: as a client tries a 503 again
                assert verdict is not None
                verdicts[verdict.status] = verdicts.get(verdict.status, 0) + 1
                return

        async def producer(name: str) -> None:
            rnd = random.Random(name)
            for seq in range(30):
                p = Producer(name, 0, seq)
                first = rnd.choice((a, b))
                await append(first, p, f"{name}:{seq:02d}".encode())
                if seq % 4 == 3:
                    await append(b if first is a else a, p, f"{name}:{seq:02d}".encode())

        await asyncio.gather(*(producer(f"p{i}") for i in range(3)))
        assert verdicts == {"accepted": 90, "duplicate": 21}
        folded = await fresh.get(path)
        assert folded is not None
        got = [m.data.decode() for m in fresh.read(folded, "-1")]
        offsets = [m.offset for m in fresh.read(folded, "-1")]
        assert len(got) == 90 and offsets == sorted(set(offsets))
        for i in range(3):
            assert [d for d in got if d.startswith(f"p{i}:")] == [f"p{i}:{seq:02d}" for seq in range(30)]
        for s in (a, b):
            await assert_eventually(functools.partial(whole, s, path, [d.encode() for d in got]), timeout=30)
    finally:
        for s in stores:
            await s.stop()
        for nc in conns:
            await nc.close()


async def test_two_stores_writing_one_stream_at_full_speed_land_every_append_once_in_order(nats: object) -> None:
    """Two gateways' writers append to one stream as fast as each is answered (each write
    fenced on its view, so they race for every sequence): none is answered 503, the stream
    holds each append once, each writer's in its order, and both views are what a fresh
    fold of JetStream gives. (A write that lost for 2 s would be answered 503: the slowest
    seen in `bench._ds_race` beside a busy loop took 0.68 s.)"""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    async with started(url, cfg, 3) as ((a, b, fresh), _):
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")
        assert await b.get(path) is not None

        async def writer(store: StreamStore, name: str) -> None:
            for i in range(100):
                await store.append(path, f"{name}:{i:03d}".encode(), content_type="text/plain", seq=None,
                                   producer=None, close=False)

        await asyncio.gather(*(writer(s, f"{s_name}{k}") for s, s_name in ((a, "a"), (b, "b")) for k in range(4)))
        folded = await fresh.get(path)
        assert folded is not None
        got = [m.data.decode() for m in fresh.read(folded, "-1")]
        assert len(got) == len(set(got)) == 800
        for name in (f"{x}{k}" for x in "ab" for k in range(4)):
            assert [d for d in got if d.startswith(name + ":")] == [f"{name}:{i:03d}" for i in range(100)]
        for s in (a, b):
            await assert_eventually(functools.partial(whole, s, path, [d.encode() for d in got]), timeout=30)


async def test_a_write_refused_again_and_again_is_tried_for_the_budget_not_a_count(nats: object) -> None:
    """A write refused for a view behind (another gateway won the sequence) is tried again
    past the least number of tries while the budget lasts, and refused once it is spent."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    async with started(url, cfg, 1) as ((a,), _):
        tries = 0

        async def refused_ten_times() -> str:
            nonlocal tries
            tries += 1
            if tries <= 10:
                raise Conflict("/s")
            return "written"

        assert await a._retrying("/s", refused_ten_times) == "written" and tries == 11

        async def always_refused() -> str:
            nonlocal tries
            tries += 1
            await asyncio.sleep(0.01)  # a refusal is a round trip to JetStream
            raise Conflict("/s")

        tries = 0
        t0 = time.monotonic()
        with pytest.raises(Conflict):
            await a._retrying("/s", always_refused)
        assert CONFLICT_BUDGET <= time.monotonic() - t0 < CONFLICT_BUDGET + 5 and tries > CONFLICT_TRIES
        assert not a._locks and not a._lock_users  # the path's lock went with its last user


@pytest.mark.servers
async def test_a_store_started_while_jetstream_does_not_answer_waits_for_it(own_nats: NatsServer,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A gateway starting while JetStream does not answer (a loaded machine, a cluster
    electing its leaders; here the server frozen) asks for its stream again instead of
    exiting (CI saw a gateway exit on a 5 s timeout of the stream's create), and serves
    once JetStream answers."""
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    nc = await nats_connect(own_nats.url, allow_reconnect=True, ping_interval=60)
    store = StreamStore(nc, cfg)
    assert own_nats.proc is not None
    try:
        await freeze(own_nats.proc)
        caplog.set_level(logging.WARNING, "gateway.durable_streams")
        starting = asyncio.create_task(store.start(patience=60))
        await assert_eventually(lambda: "trying again" in caplog.text, timeout=30)
        assert not starting.done()
        own_nats.proc.send_signal(signal.SIGCONT)
        await asyncio.wait_for(starting, 30)
        path = "/" + unique("s")
        await store.create(path, {"contentType": "text/plain"}, b"")
        await store.append(path, b"one", content_type="text/plain", seq=None, producer=None, close=False)
        await assert_eventually(functools.partial(whole, store, path, [b"one"]), timeout=10)
    finally:
        own_nats.proc.send_signal(signal.SIGCONT)
        await store.stop()
        await nc.close()


async def test_a_write_refused_on_a_view_behind_catches_it_up_without_a_new_fold(nats: object) -> None:
    """A store that hears none of the other's writes (its subscription gone) writes on a
    stale view each time: JetStream refuses it, naming the subject's last sequence, and the
    view is caught up to it record by record, never folded again whole (a whole fold of a
    long stream written fast elsewhere is raced again and again)."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    async with started(url, cfg) as ((a, b), watcher):
        folds = await counting(watcher, *fold_requests(cfg.stream))
        assert b._sub is not None
        await b._sub.unsubscribe()  # b hears nothing of a's writes from here on
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")
        view_b = await b.get(path)
        assert view_b is not None
        await watcher.flush()
        folds.clear()
        sent: list[bytes] = []
        for i in range(10):
            for store in (a, a, b):
                data = f"{len(sent):03d}".encode()
                await store.append(path, data, content_type="text/plain", seq=None, producer=None, close=False)
                sent.append(data)
        await whole(b, path, sent)
        assert await b.get(path) is view_b
        await watcher.flush()
        assert folds == []


async def test_a_forged_ack_folds_nothing_that_outlives_the_next_answer(nats: object) -> None:
    """A client of NATS that publishes, on a stream's subject, a record JetStream refuses,
    then an ack of it at a sequence far past the stream's: a close that never happened.
    An ack that names no write after its fence, or another JetStream stream, is not
    folded at all; the one that is gives way at each store's next append, whose refusal is
    checked against JetStream (the stream is not closed): the append is written, and the
    store's view is JetStream's again."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    async with started(url, cfg) as ((a, b), rogue):
        path, st = await one_record_seen_by_both(a, b, b"a1")
        last = st.js_last
        subject = b.subject(path)
        key = subject.rsplit(".", 1)[1]
        record = M.encode_record({M.OP: "close", M.GATEWAY: "evil"})
        # Refused by JetStream (no such stream expected), heard by every store all the same.
        await rogue.publish(subject, record, headers={"Nats-Expected-Last-Subject-Sequence": str(last),
                                                      "Nats-Expected-Stream": "NOPE"})
        ack = f"_DSACK.{cfg.stream}.evil.{key}.{last}.{zlib.crc32(record)}"
        # Acks on one subscription are taken in order: had either of the first two folded,
        # it would have taken the record, and the third would fold nothing.
        for n, body in enumerate(({"stream": cfg.stream, "seq": last}, {"stream": "OTHER", "seq": 10**15 - 1},
                                  {"stream": cfg.stream, "seq": 10**15})):
            await rogue.publish(f"{ack}.{n}", json.dumps(body).encode())
        await rogue.flush()

        async def phantom_closed() -> bool:
            cur = await b.get(path)
            assert cur is not None and cur.closed and cur.js_last == 10**15
            return True

        await assert_eventually(phantom_closed, timeout=30)
        await b.append(path, b"b1", content_type="text/plain", seq=None, producer=None, close=False)
        await whole(b, path, [b"a1", b"b1"])
        # a folded the forgery too, and heals the same way at its own next append (its
        # readers meanwhile are served the forgery: NATS is trusted, docs/design.md).
        await a.append(path, b"a2", content_type="text/plain", seq=None, producer=None, close=False)
        await whole(a, path, [b"a1", b"b1", b"a2"])
        await assert_eventually(functools.partial(whole, b, path, [b"a1", b"b1", b"a2"]), timeout=30)


async def test_an_append_is_fenced_on_the_view_it_was_decided_on(nats: object) -> None:
    """An append decided on a's view waits for its allowance (the tenant's quota) while b's
    append is stored and a folds it from what it heard. It is fenced on the view it was
    decided on, so JetStream refuses it and it is decided again with b's append: each
    append once, at offsets that increase strictly (fenced on the view after the wait, it
    was stored at b's offset)."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    conns = [await nats_connect(url) for _ in range(3)]
    a, b, fresh = (StreamStore(nc, cfg) for nc in conns)
    try:
        for s in (a, b, fresh):
            await s.start()
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")
        await a.append(path, b"x", content_type="text/plain", seq=None, producer=None, close=False)
        await assert_eventually(functools.partial(whole, b, path, [b"x"]), timeout=30)
        gate, waiting = asyncio.Event(), asyncio.Event()
        spend = a._ledger.spend

        async def held_spend(tenant: str, nbytes: int) -> None:
            if not gate.is_set():
                waiting.set()
                await gate.wait()
            await spend(tenant, nbytes)

        a._ledger.spend = held_spend  # type: ignore[method-assign]
        held = asyncio.create_task(a.append(path, b"A", content_type="text/plain", seq=None, producer=None,
                                            close=False))
        await waiting.wait()
        await b.append(path, b"B", content_type="text/plain", seq=None, producer=None, close=False)
        await assert_eventually(functools.partial(whole, a, path, [b"x", b"B"]), timeout=30)
        gate.set()
        await held
        st = await fresh.get(path)
        assert st is not None
        got = fresh.read(st, "-1")
        assert [m.data for m in got] == [b"x", b"B", b"A"]
        assert [m.offset for m in got] == sorted({m.offset for m in got})
    finally:
        for s in (a, b, fresh):
            await s.stop()
        for nc in conns:
            await nc.close()


async def test_a_fold_raced_by_the_other_stores_write_is_caught_up_not_folded_again(nats: object) -> None:
    """b folds the stream while a's append is stored past what the fold read: b heard the
    append (fenced on the fold's last record), so its view is cached behind it and caught up
    from there. One fold, not two."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    async with started(url, cfg) as ((a, b), watcher):
        folds = await counting(watcher, *fold_requests(cfg.stream))
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")
        sent = [f"{i:03d}".encode() for i in range(30)]
        for data in sent:
            await a.append(path, data, content_type="text/plain", seq=None, producer=None, close=False)
        load, saw, heard = b._load, b._races.saw, asyncio.Event()

        def heard_by_b(*args: object) -> None:
            saw(*args)  # type: ignore[arg-type]
            heard.set()

        async def raced_load(p: str) -> tuple[object, int]:
            folded = await load(p)  # the fold's records read; now a's append lands after them
            await a.append(path, b"late", content_type="text/plain", seq=None, producer=None, close=False)
            await heard.wait()  # b heard it while folding
            b._load = load  # type: ignore[method-assign]
            return folded

        b._races.saw = heard_by_b  # type: ignore[method-assign]

        b._load = raced_load  # type: ignore[method-assign]
        await watcher.flush()
        folds.clear()
        st = await b.get(path)
        assert st is not None and [m.data for m in b.read(st, "-1")] == [*sent, b"late"]
        assert b._cache.get(path) is st  # cached, caught up in place
        await watcher.flush()
        assert len(folds) == 1


@pytest.mark.parametrize("raced", [False, True])
async def test_a_slow_fold_never_replaces_the_view_a_write_cached_meanwhile(nats: object, raced: bool) -> None:
    """A reader's fold on b is slow to end; meanwhile b appends (on a view its append folded)
    and, raced, a appends too. The view b's append cached stays: the slow fold, cached over
    it, lacked b's own record, which b never hears (no_echo), and b served a stream without
    it as up to date."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    conns = [await nats_connect(url) for _ in range(2)]
    a, b = (StreamStore(nc, cfg) for nc in conns)
    try:
        for s in (a, b):
            await s.start()
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")
        await a.append(path, b"a1", content_type="text/plain", seq=None, producer=None, close=False)
        load, saw = b._load, b._races.saw
        release, loaded, heard = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def slow_load(p: str) -> tuple[object, int]:
            b._load = load  # type: ignore[method-assign]
            folded = await load(p)  # the reader's fold read its records; it ends late
            loaded.set()
            await release.wait()
            return folded

        def heard_by_b(*args: object) -> None:
            saw(*args)  # type: ignore[arg-type]
            heard.set()

        b._load = slow_load  # type: ignore[method-assign]
        b._races.saw = heard_by_b  # type: ignore[method-assign]
        reader = asyncio.create_task(b.get(path))
        await loaded.wait()
        want = [b"a1"]
        if raced:
            await a.append(path, b"a2", content_type="text/plain", seq=None, producer=None, close=False)
            await heard.wait()
            want.append(b"a2")
        await b.append(path, b"b-own", content_type="text/plain", seq=None, producer=None, close=False)
        want.append(b"b-own")
        release.set()
        st = await reader
        assert st is not None and [m.data for m in b.read(st, "-1")] == want
        await whole(b, path, want)
        await whole(a, path, want)
    finally:
        for s in (a, b):
            await s.stop()
        for nc in conns:
            await nc.close()


async def test_what_the_other_store_wrote_while_the_connection_was_down_is_read_after_it(nats: object) -> None:
    """b's NATS connection drops for a moment while a appends: b hears none of it, and on
    reconnecting drops its views, so its waiting reader wakes and a read has a's appends
    (b's view stayed as it was, up to date by its own account, until a's next write)."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    back = asyncio.Event()
    stores: list[StreamStore] = []

    async def reconnected() -> None:
        stores[1].reconnected()  # as the gateway's connection does (gateway/durable_streams/_app.py)
        back.set()

    b_options = {"reconnected_cb": reconnected, "reconnect_time_wait": 0.1, "max_reconnect_attempts": -1}
    async with started(url, cfg, options={1: b_options}, prepare=stores.extend) as ((a, b), _):
        path, st = await one_record_seen_by_both(a, b, b"1")
        waiting = asyncio.create_task(b.wait(st, 60))
        b._nc._transport.close()  # type: ignore[union-attr]  # a blip: nats-py reconnects
        for data in (b"2", b"3"):
            await a.append(path, data, content_type="text/plain", seq=None, producer=None, close=False)
        await back.wait()
        assert await waiting
        await whole(b, path, [b"1", b"2", b"3"])


async def test_a_fork_read_after_its_source_left_the_cache_still_has_what_it_inherits(nats: object) -> None:
    """A store that keeps two views reads a fork, then another stream (its source's view
    goes, least recently used, the fork's stays): the fork's next read still starts with what
    it inherits (it was answered with the fork's own records alone)."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"), cached_streams=2)
    nc = await nats_connect(url)
    store = StreamStore(nc, cfg)
    ct = {"contentType": "text/plain"}
    try:
        await store.start()
        src, fork = "/" + unique("src"), "/" + unique("fork")
        await store.create(src, ct, b"AAA")
        await store.append(src, b"BBB", content_type="text/plain", seq=None, producer=None, close=False)
        await store.create(fork, {**ct, "forkedFrom": src, "forkOffset": None, "forkSubOffset": -1}, b"")
        await store.append(fork, b"CCC", content_type="text/plain", seq=None, producer=None, close=False)
        await whole(store, fork, [b"AAA", b"BBB", b"CCC"])
        other = "/" + unique("other")
        await store.create(other, ct, b"x")
        await whole(store, other, [b"x"])
        assert src not in store._cache and fork in store._cache
        await whole(store, fork, [b"AAA", b"BBB", b"CCC"])
    finally:
        await store.stop()
        await nc.close()


async def test_reads_of_one_stream_against_jetstream_at_once_share_leader_reads(nats: object) -> None:
    """Twenty requests at once to read a stream on the view JetStream has (``latest``: one
    leader read each, alone) make at most two leader reads, and each has the record another
    store wrote before it came."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    async with started(url, cfg) as ((a, b), watcher):
        reads = await counting(watcher, f"$JS.API.STREAM.MSG.GET.{cfg.stream}")
        assert b._sub is not None
        await b._sub.unsubscribe()  # b hears nothing of a's writes: only the reads catch it up
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")
        await whole(b, path, [])
        await a.append(path, b"x", content_type="text/plain", seq=None, producer=None, close=False)
        await watcher.flush()
        reads.clear()
        views = await asyncio.gather(*(b.latest(path) for _ in range(20)))
        await watcher.flush()
        assert 1 <= len(reads) <= 2, len(reads)
        assert all(v is not None and [m.data for m in b.read(v, "-1")] == [b"x"] for v in views)
        assert b._latest == {}


async def test_a_long_stream_written_fast_through_the_other_store_is_folded_once(nats: object) -> None:
    """b reads a 2,000-record stream again and again while a appends to it nonstop: b folds it
    once, then catches up (each fold raced by a's appends was done again, then served
    uncached, so every read folded the whole stream again)."""
    url = nats.url  # type: ignore[attr-defined]
    cfg = StoreConfig(stream=unique("DS").upper(), subject_prefix=unique("ds"))
    conns = [await nats_connect(url) for _ in range(3)]
    a, b = (StreamStore(nc, cfg) for nc in conns[:2])
    folds = await counting(conns[2], *fold_requests(cfg.stream))
    stop = asyncio.Event()
    sent: list[bytes] = []

    async def write() -> None:
        while not stop.is_set():
            data = f"{len(sent):05d}".encode()
            await a.append(path, data, content_type="text/plain", seq=None, producer=None, close=False)
            sent.append(data)

    try:
        for s in (a, b):
            await s.start()
        path = "/" + unique("s")
        await a.create(path, {"contentType": "text/plain"}, b"")
        for i in range(2000):
            await a.append(path, f"{i:05d}".encode(), content_type="text/plain", seq=None, producer=None,
                           close=False)
        await conns[2].flush()
        folds.clear()
        writer = asyncio.create_task(write())
        await assert_eventually(lambda: len(sent) >= 20, timeout=30)
        for _ in range(20):
            assert await b.get(path) is not None
        stop.set()
        await writer
        assert b._cache.get(path) is not None
        await assert_eventually(functools.partial(whole, b, path, [f"{i:05d}".encode() for i in range(2000)] + sent),
                                timeout=30)
        await conns[2].flush()
        assert len(folds) <= 1, len(folds)  # b's one fold
    finally:
        stop.set()
        for s in (a, b):
            await s.stop()
        for nc in conns:
            await nc.close()


@contextlib.asynccontextmanager
async def started(url: str, cfg: StoreConfig, n: int = 2, *, options: dict[int, dict[str, Any]] | None = None,
                  prepare: Callable[[list[StreamStore]], None] | None = None,
                  ) -> AsyncIterator[tuple[list[StreamStore], nats.NATS]]:
    """``n`` stores of ``cfg``, each on its own no-echo connection (store ``i``'s with
    ``options[i]`` for ``nats.connect``), handed to ``prepare`` and started; and a connection
    of the test's own (to count or forge what goes over NATS). Stopped and closed after."""
    conns = [await nats_connect(url, **(options or {}).get(i, {})) for i in range(n + 1)]
    stores = [StreamStore(nc, cfg) for nc in conns[:n]]
    try:
        if prepare is not None:
            prepare(stores)
        for s in stores:
            await s.start()
        yield stores, conns[n]
    finally:
        for s in stores:
            await s.stop()
        for nc in conns:
            await nc.close()


async def one_record_seen_by_both(a: StreamStore, b: StreamStore, data: bytes) -> tuple[str, StreamState]:
    """A new stream made and appended ``data`` through ``a``; its path, and ``b``'s view once
    ``b`` has the record."""
    path = "/" + unique("s")
    await a.create(path, {"contentType": "text/plain"}, b"")
    await a.append(path, data, content_type="text/plain", seq=None, producer=None, close=False)
    await assert_eventually(functools.partial(whole, b, path, [data]), timeout=30)
    st = await b.get(path)
    assert st is not None
    return path, st


async def counting(nc: nats.NATS, *subjects: str) -> list[Msg]:
    """The messages on ``subjects`` from now on (JetStream API requests counted)."""
    seen: list[Msg] = []

    async def count(msg: Msg) -> None:
        seen.append(msg)

    for subject in subjects:
        await nc.subscribe(subject, cb=count)
    return seen


def fold_requests(stream: str) -> tuple[str, str]:
    """The subjects of the consumer creates a fold makes (an unnamed consumer's, a named one's)."""
    return f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>"


class _InboxPublisher(Publisher):
    """A gateway's publisher from before the shared acks: its acks come to its own inbox."""

    async def publish(self, subject: str, payload: bytes, expected_last_subject_seq: int,
                      tag: str = "") -> dict[str, object]:
        return await super().publish(subject, payload, expected_last_subject_seq)


async def nats_connect(url: str, **options: Any) -> nats.NATS:
    return await nats.connect(url, no_echo=True, **options)


async def whole(store: StreamStore, path: str, sent: list[bytes]) -> bool:
    st = await store.get(path)
    assert st is not None and [m.data for m in store.read(st, "-1")] == sent
    return True
