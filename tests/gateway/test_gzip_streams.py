"""A run's stream gzip-encoded for a client that admits it (``BATON_HTTP_COMPRESSION``,
gateway/_compression.py): the same chunks as without, fewer bytes on the wire, and a live
chunk decodable when it is sent, not when the stream ends.

Chunks are written with the real log writer to a real nats-server; httpx decodes gzip as
a browser's fetch does (its default ``Accept-Encoding`` is ``gzip, deflate``).
"""
from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

import httpx
import pytest

from baton.log import DeliveryLog
from baton.sse import Comment, aiter_sse
from tests.conftest import unique
from tests.gateway.conftest import Gateway, read_stream, run_chunks, write_run

IDENTITY = {"Accept-Encoding": "identity"}


async def _wire_bytes(http: httpx.AsyncClient, url: str, params: dict[str, str], headers: dict[str, str]) -> int:
    async with http.stream("GET", url, params=params, headers=headers) as resp:
        return sum([len(b) async for b in resp.aiter_raw()])


@pytest.mark.parametrize("ndjson", [False, True], ids=["sse", "ndjson"])
async def test_a_join_is_the_same_chunks_in_fewer_bytes(gateway: Gateway, http: httpx.AsyncClient,
                                                        dlog: DeliveryLog, ndjson: bool) -> None:
    run_id, thread_id = unique("run"), unique("th")
    chunks = run_chunks(run_id, thread_id, [f"word {i} of a long answer " for i in range(200)])
    _, offsets = await write_run(dlog, run_id, chunks)
    url, params = f"{gateway.url}/api/chat", {"runId": run_id, "offset": "-1"}

    async with asyncio.timeout(20):
        packed = await read_stream(http, "GET", url, ndjson=ndjson, params=params)
        plain = await read_stream(http, "GET", url, ndjson=ndjson, params=params, headers=IDENTITY)
        accept = {"Accept": "application/x-ndjson"} if ndjson else {}
        packed_bytes = await _wire_bytes(http, url, params, accept)
        plain_bytes = await _wire_bytes(http, url, params, {**accept, **IDENTITY})

    assert packed.headers["content-encoding"] == "gzip"
    assert packed.headers["vary"] == "accept-encoding"
    assert "content-encoding" not in plain.headers and plain.headers["vary"] == "accept-encoding"
    assert packed.events == plain.events == list(zip(offsets, chunks))
    assert packed.ended == plain.ended == (not ndjson)
    assert packed_bytes < plain_bytes / 4, (packed_bytes, plain_bytes)


async def test_a_live_chunk_decodes_when_it_is_sent(gateway: Gateway, http: httpx.AsyncClient,
                                                    dlog: DeliveryLog) -> None:
    """The stream stays open between the writes: every chunk must decode from what the
    gateway sent so far (gzip that waited for more input would hold it back)."""
    run_id, thread_id = unique("run"), unique("th")
    chunks = run_chunks(run_id, thread_id, ["one", "two", "three"])
    w, offsets = await write_run(dlog, run_id, chunks[:2], close=False)
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)

    async def decoded(raw: Any) -> Any:
        async for piece in raw:
            yield inflate.decompress(piece)

    got: list[tuple[str | None, dict[str, Any]]] = []
    async with asyncio.timeout(20):
        async with http.stream("GET", f"{gateway.url}/api/chat", params={"runId": run_id, "offset": "-1"}) as resp:
            assert resp.headers["content-encoding"] == "gzip"
            events = aiter_sse(decoded(resp.aiter_raw()))
            ended = False
            async for item in events:
                if isinstance(item, Comment):
                    ended = ended or item.text == "end"
                    continue  # read on to the response's end: the gzip trailer
                got.append((item.id, json.loads(item.data)))
                if len(got) == 2:  # both before any further write: sent, and decodable
                    offsets += await w.append(chunks[2:4], origin="journal")
                elif len(got) == 4:
                    offsets += await w.append(chunks[4:], origin="journal")
                    await w.close("completed")
            assert ended
    assert got == list(zip(offsets, chunks))
    assert inflate.eof  # the trailer came: a whole gzip member, CRC and length checked


async def test_compression_off_sends_every_stream_as_it_is(make_gateway: Any, http: httpx.AsyncClient,
                                                           dlog: DeliveryLog) -> None:
    gateway = await make_gateway(http_compression=False)
    run_id, thread_id = unique("run"), unique("th")
    chunks = run_chunks(run_id, thread_id, ["a", "b"])
    _, offsets = await write_run(dlog, run_id, chunks)
    async with asyncio.timeout(10):
        got = await read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": run_id, "offset": "-1"},
                                headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in got.headers and "vary" not in got.headers
    assert got.events == list(zip(offsets, chunks))
