"""Transcripts in the KV bucket: compare-on-revision, and values larger than the limit."""
from __future__ import annotations

from typing import Any, AsyncIterator

import pytest
from nats.aio.client import Client as NATS

from baton.errors import TranscriptConflict
from baton.log import LogConfig, TranscriptStore
from baton.log._transcripts import thread_key
from tests.conftest import unique
from tests.log.conftest import unique_cfg


@pytest.fixture
async def small(nc: NATS) -> AsyncIterator[tuple[TranscriptStore, LogConfig]]:
    """A store on a bucket of its own that takes values of at most 4 KiB."""
    cfg = unique_cfg()
    ts = TranscriptStore(nc, cfg, max_value_size=4096)
    await ts.provision()
    yield ts, cfg
    await nc.jetstream().delete_key_value(cfg.bucket)


def messages(n: int, size: int = 10) -> list[dict[str, Any]]:
    return [{"id": f"m{i}", "role": "assistant" if i % 2 else "user", "content": f"{i}:" + "ü" * size}
            for i in range(n)]


async def test_create_load_update_with_compare_on_revision(small: tuple[TranscriptStore, LogConfig]) -> None:
    ts, _ = small
    thread = unique("thread/ü. *")
    assert await ts.load(thread) == ([], None)
    rev1 = await ts.save(thread, messages(2))
    assert await ts.load(thread) == (messages(2), rev1)
    with pytest.raises(TranscriptConflict):
        await ts.save(thread, messages(3))  # create, but it exists
    rev2 = await ts.save(thread, messages(3), expected_revision=rev1)
    with pytest.raises(TranscriptConflict) as err:
        await ts.save(thread, messages(4), expected_revision=rev1)  # stale
    assert err.value.expected_revision == rev1
    assert await ts.load(thread) == (messages(3), rev2)


async def test_transcript_larger_than_the_value_limit_is_saved_whole(
    small: tuple[TranscriptStore, LogConfig], nc: NATS
) -> None:
    ts, cfg = small
    thread = unique("big")
    big = messages(40, size=500)  # ~40 KB of UTF-8, ten times the bucket's limit
    rev = await ts.save(thread, big)
    assert await ts.load(thread) == (big, rev)
    # a second, different big save replaces it (and its old parts go away)
    bigger = messages(60, size=400)
    rev2 = await ts.save(thread, bigger, expected_revision=rev)
    assert await ts.load(thread) == (bigger, rev2)
    kv = await nc.jetstream().key_value(cfg.bucket)
    keys = [k for k in await kv.keys() if k.startswith(thread_key(thread) + ".")]
    entries = [len((await kv.get(k)).value or b"") for k in keys]
    assert all(size <= 4096 for size in entries)
    assert sum(entries) >= 60 * 400  # only the live generation's parts remain
    # shrinking back to a small value works and a fresh store instance reads it
    rev3 = await ts.save(thread, messages(1), expected_revision=rev2)
    assert await TranscriptStore(nc, cfg).load(thread) == (messages(1), rev3)


async def test_a_lost_big_save_race_does_not_corrupt_the_winner(small: tuple[TranscriptStore, LogConfig]) -> None:
    ts, _ = small
    thread = unique("race")
    rev = await ts.save(thread, messages(1))
    winner = messages(30, size=300)
    rev_w = await ts.save(thread, winner, expected_revision=rev)
    with pytest.raises(TranscriptConflict):
        await ts.save(thread, messages(35, size=300), expected_revision=rev)
    assert await ts.load(thread) == (winner, rev_w)
