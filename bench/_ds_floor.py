"""The floor side of ``bench/durable_streams.py``: the least a Python server on baton's stack
must do per Durable Streams append, with none of the protocol.

``python -m bench._ds_floor NATS_URL PORT`` serves, under the gateway's own uvicorn setup
(uvloop, httptools, no access log):
- ``PUT /ds/<path>``: 201 and ``Stream-Next-Offset``, nothing stored;
- ``POST /ds/<path>``: the body published to JetStream (file storage, fenced on the subject's
  last sequence, answered after the ack: what the gateway does) with
  :class:`gateway.durable_streams._publish.Publisher`, then 204 and ``Stream-Next-Offset``;
- ``GET /ds/<path>?offset=O&live=long-poll``: the bytes appended after ``O``, from memory,
  waiting up to 10 s for the next append.

No auth, no headers checked, no producers, no JSON mode, no cache, no record of the stream:
what it measures is uvicorn + nats-py + JetStream alone. Should this floor already fall short
of a reference side, no protocol work on top of it can reach that side.
"""
from __future__ import annotations

import asyncio
import sys
from typing import Any

import nats
import uvicorn

from gateway.durable_streams._publish import Publisher

STREAM, PREFIX = "BENCH_FLOOR", "benchfloor."


class Floor:
    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url
        self.pub: Publisher | None = None
        self.last: dict[str, int] = {}
        self.data: dict[str, list[bytes]] = {}
        self.changed: dict[str, asyncio.Event] = {}

    async def start(self) -> None:
        nc = await nats.connect(self.nats_url)
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=[PREFIX + ">"])
        self.pub = Publisher(nc)
        await self.pub.start()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await self.start()
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        method = scope["method"]
        status, body, offset = 200, b"", 0
        if method == "PUT":
            self.data.setdefault(path, [])
            self.changed.setdefault(path, asyncio.Event())
            status = 201
        elif method == "POST":
            chunks = []
            more = True
            while more:
                msg = await receive()
                chunks.append(msg.get("body", b""))
                more = msg.get("more_body", False)
            assert self.pub is not None
            subject = PREFIX + str(abs(hash(path)))
            ack = await self.pub.publish(subject, b"".join(chunks), self.last.get(subject, 0))
            self.last[subject] = ack["seq"]
            self.data[path].append(b"".join(chunks))
            ev = self.changed[path]
            self.changed[path] = asyncio.Event()
            ev.set()
            status, offset = 204, len(self.data[path])
        else:
            q = dict(p.split("=", 1) for p in scope["query_string"].decode().split("&") if "=" in p)
            after = int(q.get("offset", "0") or 0)
            if len(self.data[path]) <= after:
                try:
                    async with asyncio.timeout(10):
                        await self.changed[path].wait()
                except TimeoutError:
                    status = 204
            body = b"".join(self.data[path][after:])
            offset = len(self.data[path])
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"stream-next-offset", str(offset).encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def main() -> None:
    nats_url, port = sys.argv[1], int(sys.argv[2])
    uvicorn.run(Floor(nats_url), host="127.0.0.1", port=port, log_level="warning", access_log=False,
                server_header=False, lifespan="on", loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()
