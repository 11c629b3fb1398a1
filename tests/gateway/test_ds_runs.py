"""A run's delivery log read as a Durable Stream (``/ds/runs/<runId>``): catch-up, live SSE,
closed at the end, read-only, and the gateway's tenancy."""
from __future__ import annotations

import json
import time
from typing import Any

import httpx

from baton.sse import Event, aiter_sse
from tests.conftest import unique
from tests.gateway.conftest import Gateway, GatewayFactory, read_stream
from tests.gateway.test_e2e import SLOW, replay_body


async def joined_chunks(http: httpx.AsyncClient, gw: Gateway, run: str, **kw: Any) -> list[dict[str, Any]]:
    got = await read_stream(http, "GET", f"{gw.url}/api/chat", params={"runId": run, "offset": "-1"}, **kw)
    return [c for _, c in got.events]


async def test_finished_run_reads_as_a_closed_json_stream_and_refuses_writes(
        host: Any, gateway: Gateway, http: httpx.AsyncClient) -> None:
    thread, run = unique("th"), unique("run")
    await read_stream(http, "POST", f"{gateway.url}/api/chat", json=replay_body(thread, run), headers={"X-Run-Id": run})
    chunks = await joined_chunks(http, gateway, run)
    url = f"{gateway.url}/ds/runs/{run}"

    r = await http.get(url, params={"offset": "-1"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == chunks
    assert r.headers["stream-closed"] == "true" and r.headers["stream-up-to-date"] == "true"
    tail = r.headers["stream-next-offset"]
    head = await http.head(url)
    assert head.headers["stream-next-offset"] == tail and head.headers["stream-closed"] == "true"
    # Resuming from a middle offset gives exactly the rest.
    half = await http.get(url, params={"offset": "-1"})
    assert half.json() == chunks
    poll = await http.get(url, params={"offset": tail, "live": "long-poll"})
    assert poll.status_code == 204 and poll.headers["stream-closed"] == "true"
    # SSE from the start: every chunk once, in order, then the closing control event.
    data, controls = await read_sse(http, url, "-1")
    assert data == chunks and controls[-1].get("streamClosed") is True, (len(data), controls)
    # Only the run's fenced writer appends: the protocol's writes are refused, nothing changes.
    for method in ("POST", "PUT", "DELETE"):
        w = await http.request(method, url, content=b'{"type":"RAW"}', headers={"content-type": "application/json"})
        assert w.status_code == 405
    assert (await http.get(url, params={"offset": "-1"})).json() == chunks


async def test_live_run_tails_over_sse_until_it_closes(host: Any, gateway: Gateway, http: httpx.AsyncClient) -> None:
    thread, run = unique("th"), unique("run")
    # The starting client leaves after a few chunks; the run goes on and is read live.
    await read_stream(http, "POST", f"{gateway.url}/api/chat", json=replay_body(thread, run, SLOW, speed=1),
                      headers={"X-Run-Id": run}, stop_after=3)
    data, controls = await read_sse(http, f"{gateway.url}/ds/runs/{run}", "-1")
    assert controls[-1].get("streamClosed") is True
    assert data == await joined_chunks(http, gateway, run)
    assert data[-1]["type"] == "RUN_FINISHED"


async def test_tenancy_other_tenants_run_is_unknown(host: Any, make_gateway: GatewayFactory,
                                                   http: httpx.AsyncClient) -> None:
    gw = await make_gateway(api_keys={"key-a": "a", "key-b": "b"})
    thread, run = unique("th"), unique("run")
    a = {"authorization": "Bearer key-a"}
    await read_stream(http, "POST", f"{gw.url}/api/chat", json=replay_body(thread, run),
                      headers={"X-Run-Id": run, **a})
    url = f"{gw.url}/ds/runs/{run}"
    assert (await http.get(url, params={"offset": "-1"}, headers=a)).status_code == 200
    assert (await http.get(url, params={"offset": "-1"}, headers={"authorization": "Bearer key-b"})).status_code == 404
    assert (await http.get(url, params={"offset": "-1"})).status_code == 401
    # Streams a tenant creates are its own namespace.
    s = f"{gw.url}/ds/v1/stream/{unique('s')}"
    assert (await http.put(s, headers={**a, "content-type": "text/plain"}, content=b"x")).status_code == 201
    assert (await http.get(s, params={"offset": "-1"}, headers={"authorization": "Bearer key-b"})).status_code == 404
    assert (await http.get(s, params={"offset": "-1"}, headers=a)).content == b"x"


async def read_sse(http: httpx.AsyncClient, url: str, offset: str) -> tuple[list[Any], list[dict[str, Any]]]:
    """Read a protocol SSE stream until it is closed, as a Durable Streams client does: a
    response that ends without ``streamClosed`` (the server's log read failed, say under
    load) is resumed from the last ``streamNextOffset`` (PROTOCOL.md §5.7).

    Returns:
        (values of the data events, control events).
    """
    data: list[Any] = []
    controls: list[dict[str, Any]] = []
    for _ in range(10):
        async with http.stream("GET", url, params={"offset": offset, "live": "sse"}, timeout=60) as resp:
            assert resp.status_code == 200
            async for ev in aiter_sse(resp.aiter_bytes()):
                if not isinstance(ev, Event):
                    continue
                if ev.event == "data":
                    data += json.loads(ev.data)
                elif ev.event == "control":
                    controls.append(json.loads(ev.data))
                    offset = controls[-1].get("streamNextOffset", offset)
        if controls and controls[-1].get("streamClosed"):
            break
    return data, controls


async def test_a_fork_source_never_names_another_tenants_stream(make_gateway: GatewayFactory,
                                                              http: httpx.AsyncClient) -> None:
    # Tenant names are free text: "acme" is a prefix of "acme2", and one may contain "/".
    gw = await make_gateway(api_keys={"key-a": "acme", "key-b": "acme2", "key-c": "acme/x"})
    a, b, c = ({"authorization": f"Bearer key-{k}"} for k in "abc")
    name = unique("secret")
    secret = f"{gw.url}/ds/{name}"
    assert (await http.put(secret, headers={**b, "content-type": "text/plain"}, content=b"b's")).status_code == 201
    assert (await http.put(secret, headers={**c, "content-type": "text/plain"}, content=b"c's")).status_code == 201
    # A fork source without a leading "/" must not reach past the tenant's own namespace.
    fork = f"{gw.url}/ds/{unique('fork')}"
    r = await http.put(fork, headers={**a, "stream-forked-from": f"2/{name}"})
    assert r.status_code == 404
    assert (await http.get(fork, params={"offset": "-1"}, headers=a)).status_code == 404
    # Nor does a path under a tenant whose name is "acme" + "/x".
    assert (await http.get(f"{gw.url}/ds/x/{name}", params={"offset": "-1"}, headers=a)).status_code == 404
    assert (await http.get(secret, params={"offset": "-1"}, headers=c)).content == b"c's"
    # A fork of the tenant's own stream, with or without the leading "/", still works.
    own = unique("own")
    assert (await http.put(f"{gw.url}/ds/{own}", headers={**a, "content-type": "text/plain"},
                           content=b"a's")).status_code == 201
    for src in (f"/{own}", own):
        f = f"{gw.url}/ds/{unique('fork')}"
        assert (await http.put(f, headers={**a, "stream-forked-from": src})).status_code == 201
        assert (await http.get(f, params={"offset": "-1"}, headers=a)).content == b"a's"


async def test_an_sse_reader_with_a_big_backlog_sees_the_close(gateway: Gateway, cc: Any, dlog: Any) -> None:
    """A reader whose client is slower than the log read (its backlog fills every buffer on
    the way: the socket's, and what the gateway keeps for it) still gets every chunk and then
    the closing control event, not an endless wait after the last chunk."""
    import asyncio
    import socket
    import urllib.parse

    from baton.v1 import runs_pb2
    from tests.conftest import assert_eventually
    from tests.gateway.conftest import run_chunks, write_run

    thread, run = unique("th"), unique("run")
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run, thread_id=thread, started_at=time.time(),
                                                     status=runs_pb2.RUN_STATUS_COMPLETED), interrupt_active=False)
    chunks = run_chunks(run, thread, [f"{i:04d}" + "x" * 2000 for i in range(600)])
    await write_run(dlog, run, chunks, close=True)

    url = urllib.parse.urlsplit(gateway.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow client: little room on its side
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (url.hostname, url.port))
    # A small read buffer on the client's side too: it stops reading the socket while full.
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    try:
        writer.write(f"GET /ds/runs/{run}?offset=-1&live=sse HTTP/1.1\r\nHost: {url.netloc}\r\n"
                     "Connection: close\r\n\r\n".encode())
        await writer.drain()
        # Read nothing until the socket is full: the gateway's writes then wait on it while
        # its log read runs ahead of them.
        import fcntl
        import struct
        import termios

        def waiting() -> int:
            return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]

        full = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
        await assert_eventually(lambda: waiting() >= full, timeout=20)
        parser_input = bytearray()
        async with asyncio.timeout(60):
            while True:
                part = await reader.read(4096)
                if not part:
                    break
                await asyncio.sleep(0.005)  # a slow client: the gateway's log read stays ahead of it
                parser_input += part
                if b'"streamClosed":true' in parser_input:
                    break
    finally:
        writer.close()
    body = bytes(parser_input).split(b"\r\n\r\n", 1)[1]
    assert b'"streamClosed":true' in body
    assert body.count(b"event: data") == len(chunks)



async def test_a_live_ds_reader_is_a_reader_of_the_run(gateway: Gateway, http: httpx.AsyncClient, cc: Any,
                                                        dlog: Any) -> None:
    """A /ds SSE read is served like a join: it counts as a reader (presence) while it
    waits, and its GET looks at the run for a takeover (a run whose claim is held is left
    alone)."""
    import asyncio

    from baton.v1 import runs_pb2
    from tests.conftest import assert_eventually
    from tests.gateway.conftest import run_chunks, write_run

    thread, run = unique("th"), unique("run")
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run, thread_id=thread, started_at=time.time(),
                                                     status=runs_pb2.RUN_STATUS_INTERRUPTED), interrupt_active=False)
    # The test is the run's driver: it holds the claim, so the coordinator's failover (a
    # module's host may be alive) never hands the run to a host that would fail it (no sandbox).
    session = await cc.open_session(ttl=10.0, owner="test-driver")
    epoch, _ = await cc.claim_run(run, session, "test-driver", purpose="drive")
    chunks = run_chunks(run, thread, ["a", "b"])
    w, _ = await write_run(dlog, run, chunks[:2], close=False, epoch=epoch)

    async def decisions() -> dict[str, float]:
        text = (await http.get(f"{gateway.url}/metrics")).text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line.startswith("baton_gateway_takeover_decisions_total{")}

    before = await decisions()
    reading = asyncio.create_task(read_sse(http, f"{gateway.url}/ds/runs/{run}", "-1"))
    try:
        await assert_eventually(lambda: gateway.state.metrics.readers._value.get() == 1, timeout=10)
        after = await decisions()
        assert sum(after.values()) == sum(before.values()) + 1, (before, after)
        await w.append(chunks[2:], origin="journal")
        await w.close("completed")
        data, controls = await asyncio.wait_for(reading, 30)
    finally:
        reading.cancel()
    await session.close()
    assert data == chunks and controls[-1].get("streamClosed") is True, (len(data), controls)
    await assert_eventually(lambda: gateway.state.metrics.readers._value.get() == 0, timeout=10)
