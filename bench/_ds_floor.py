"""The floor side of ``bench/durable_streams.py``: the least a Python server on baton's stack
must do per Durable Streams append, with none of the protocol.

``python -m bench._ds_floor NATS_URL PORT [WORKERS]`` serves, under the gateway's own uvicorn
setup (uvloop, httptools, no access log), in ``WORKERS`` processes (default 1) on one port
(``SO_REUSEPORT``, as the gateway's workers; the kernel spreads connections, not requests):
- ``PUT /ds/<path>``: 201 and ``Stream-Next-Offset``, nothing stored;
- ``POST /ds/<path>``: the body published to JetStream (file storage, fenced on the subject's
  last sequence, answered after the ack: what the gateway does) with
  :class:`gateway.durable_streams._publish.Publisher`, then 204 and ``Stream-Next-Offset``;
- ``GET /ds/<path>?offset=O&live=long-poll``: the bytes appended after ``O``, from memory,
  waiting up to 10 s for the next append.

No auth, no headers checked, no producers, no JSON mode, no cache, no record of the stream:
what it measures is uvicorn + nats-py + JetStream alone. Should this floor already fall short
of a reference side, no protocol work on top of it can reach that side.

With several workers each process publishes a stream's appends to a subject of its own (its
fence knows only its own appends) and keeps its own memory of them, so a long-poll read sees
only what its own process took: the appends are the floor's, its reads are not measured.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import zlib
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
        # One retry: a floor that cannot reach NATS fails its start in seconds, not after
        # nats-py's default 60 attempts 2 s apart (allow_reconnect=False does not cut those).
        nc = await nats.connect(self.nats_url, max_reconnect_attempts=1)
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
                    print(READY, flush=True)
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
            subject = f"{PREFIX}{os.getpid()}.{zlib.crc32(path.encode())}"
            self.data.setdefault(path, [])
            self.changed.setdefault(path, asyncio.Event())
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


#: The line each worker prints once its app has started (``start_floor`` counts them).
READY = "floor worker ready"


def main() -> None:
    nats_url, port = sys.argv[1], int(sys.argv[2])
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    if workers > 1:
        _supervise(nats_url, port, workers)
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sys.argv[4:] == ["reuse"]:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(Floor(nats_url), log_level="warning", access_log=False, server_header=False,
                            lifespan="on", loop="uvloop", http="httptools")
    uvicorn.Server(config).run(sockets=[sock])


def _supervise(nats_url: str, port: int, workers: int) -> None:
    """Run ``workers`` one-worker floors on ``port`` and wait. When any of them exits, or on
    SIGTERM, the others are terminated and waited for: the floor is all of them or none."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(workers):
            procs.append(subprocess.Popen([sys.executable, "-m", "bench._ds_floor", nats_url, str(port), "1", "reuse"]))
        pid, status = os.wait()
        sys.exit(f"floor worker {pid} exited (status {status}): the floor stops")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
