"""The readers of the gateway benches (bench/gateway.py, bench/grpc.py): raw asyncio SSE
connections that count events and their append → receive latency, plain or asking for gzip,
and the helpers around them (open, close, wait until delivered, the chunk they count)."""
from __future__ import annotations

import asyncio
import pathlib
import re
import time
import zlib
from typing import Any, Awaitable, Callable

_EVENT = re.compile(rb"data: ([^\n]*)\n\n")
_SENT = re.compile(rb'"t":([0-9.]+)')


def rss_kb(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Reader:
    """A raw SSE reader: counts events and records append→receive latency (seconds)."""

    def __init__(self, port: int, path: str) -> None:
        self.port, self.path = port, path
        self.latencies: list[float] = []
        self.count = 0
        self.last_at = 0.0
        self.task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    async def run(self) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", self.port)
        w.write(f"GET {self.path} HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n".encode())
        await w.drain()
        buf = b""
        try:
            while True:
                data = await r.read(65536)
                if not data:
                    return
                now = time.time()
                if not self.connected.is_set():
                    self.connected.set()
                buf = self._events(buf + data, now)
        finally:
            w.close()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    def _events(self, buf: bytes, now: float) -> bytes:
        """Count the whole events at the start of ``buf``; → what is left of it."""
        end = 0
        for m in _EVENT.finditer(buf):
            end = m.end()
            sent = _SENT.search(m.group(1))
            if sent:
                self.latencies.append(now - float(sent.group(1)))
            self.count += 1
            self.last_at = now
        return buf[end:] if end else buf


class GzipReader(Reader):
    """A raw SSE reader that asks for gzip (``Accept-Encoding: gzip``, as browsers do) and
    takes the chunked body apart and inflates it as it comes, before counting: one socket
    read per wake-up, as :class:`Reader` does, so the two differ by the inflating."""

    async def run(self) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", self.port)
        w.write(f"GET {self.path} HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n"
                "Accept-Encoding: gzip\r\n\r\n".encode())
        await w.drain()
        try:
            head = (await r.readuntil(b"\r\n\r\n")).lower()
            if b"content-encoding: gzip" not in head or b"transfer-encoding: chunked" not in head:
                raise RuntimeError(f"not a chunked gzip stream: {head[:300]!r}")
            self.connected.set()
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            wire, buf = b"", b""
            while True:
                data = await r.read(65536)
                if not data:
                    return
                wire += data
                pos, body = 0, []
                while True:  # every whole HTTP chunk in what came: "<hex size>\r\n<data>\r\n"
                    eol = wire.find(b"\r\n", pos)
                    if eol < 0:
                        break
                    size = int(wire[pos:eol].split(b";")[0], 16)
                    if size == 0:
                        return
                    if len(wire) < eol + 2 + size + 2:
                        break
                    body.append(wire[eol + 2:eol + 2 + size])
                    pos = eol + 2 + size + 2
                wire = wire[pos:]
                if body:
                    buf = self._events(buf + inflate.decompress(b"".join(body)), time.time())
        finally:
            w.close()


async def open_readers(n: int, port: int, path_of: Callable[[int], str], count_readers: Callable[[], Awaitable[int]],
                       base: int = 0, kind: type[Reader] = Reader) -> list[Reader]:
    readers = [kind(port, path_of(i)) for i in range(n)]
    for i in range(0, n, 100):  # do not overflow the listen backlog
        for rd in readers[i:i + 100]:
            rd.start()
        await asyncio.sleep(0.05)
    deadline = time.monotonic() + 60
    while await count_readers() < base + n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {await count_readers() - base} of {n} readers registered")
        await asyncio.sleep(0.1)
    return readers


async def close_readers(readers: list[Reader]) -> None:
    tasks = [r.task for r in readers if r.task is not None]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks)


def chunk(i: int, run: str) -> dict[str, Any]:
    # A realistic text delta; "t" is the send time (wall clock, same machine).
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": f"{run}-m", "delta": f"token {i} " + "x" * 40,
            "t": time.time()}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


async def wait_delivered(readers: list[Reader], per_reader: int, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while any(r.count < per_reader for r in readers):
        if time.monotonic() > deadline:
            got = sum(min(r.count, per_reader) for r in readers)
            raise TimeoutError(f"delivered {got} of {per_reader * len(readers)}")
        await asyncio.sleep(0.01)
    return max(r.last_at for r in readers)
