"""A TCP proxy whose link can be cut and blocked: a network blip between two processes.

It runs in the caller's event loop and forwards ``127.0.0.1:<port>`` to a target address,
so any process (a coordinator subprocess talking to etcd, a host talking to NATS) can be
pointed at :attr:`TcpProxy.endpoint` instead of the real server.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any


class TcpProxy:
    """Forward TCP connections to ``target_host:target_port``.

    ``cut()`` aborts every open connection (both sides see a reset); while ``down`` is set,
    new connections are accepted and closed at once (a peer that is unreachable fast, as
    after a route flap) instead of being forwarded.

    Attributes:
        port: the local port (0 until :meth:`start`).
        down: refuse to forward new connections.
        latency: seconds each chunk of bytes is held before it is passed on, either way
            (a slow link or a peer slow to answer; order is kept).
        flowing: ``{"up": Event, "down": Event}``: while one is clear, the bytes of that
            direction (``up``: client → target) are held, not passed on, and the link
            stays open (a partition, one-way when only one is clear; :meth:`hold`).
        connections: connections accepted so far.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        self.down = False
        self.latency = 0.0
        self.connections = 0
        self.flowing = {"up": asyncio.Event(), "down": asyncio.Event()}
        for e in self.flowing.values():
            e.set()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> "TcpProxy":
        """Listen on ``port`` (0 = a free one); returns self."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        me = asyncio.current_task()
        assert me is not None
        self._tasks.add(me)
        me.add_done_callback(self._tasks.discard)
        if self.down:
            w.transport.abort()
            return
        try:
            ur, uw = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            w.transport.abort()
            return
        if self.down:  # the link went down while we dialled the target
            uw.transport.abort()
            w.transport.abort()
            return
        self._writers |= {w, uw}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, way: str) -> None:
            loop = asyncio.get_running_loop()
            # Chunks held by ``latency``, each due at its arrival + the latency then; a
            # chunk never overtakes one held before it (when the latency drops, say).
            held: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

            async def release() -> None:
                while (item := await held.get()) is not None:
                    due, data = item
                    if (wait := due - loop.time()) > 0:
                        await asyncio.sleep(wait)
                    await self.flowing[way].wait()
                    dst.write(data)
                    await dst.drain()

            releaser = asyncio.create_task(release())
            try:
                while data := await src.read(65536):
                    held.put_nowait((loop.time() + self.latency, data))
                    if releaser.done():
                        break
                held.put_nowait(None)
                if not self.down:  # an orderly end: what is held still goes out first
                    await asyncio.wait({releaser})
            except (ConnectionError, OSError):
                pass
            finally:
                releaser.cancel()
                await asyncio.gather(releaser, return_exceptions=True)
                # A blip resets the other side too; an orderly end is passed on as one.
                if self.down:
                    dst.transport.abort()
                else:
                    dst.close()

        pipes = [asyncio.create_task(pipe(r, uw, "up")), asyncio.create_task(pipe(ur, w, "down"))]
        try:
            await asyncio.wait(pipes)
        finally:
            for t in pipes:
                t.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            self._writers -= {w, uw}

    def cut(self) -> None:
        """Abort every open connection (both sides see a reset)."""
        for w in list(self._writers):
            w.transport.abort()

    async def blip(self, seconds: float) -> None:
        """Cut every connection and refuse new ones for ``seconds``, then forward again."""
        self.down = True
        self.cut()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.down = False

    def hold(self, *ways: str) -> None:
        """Hold the bytes of ``ways`` (``up``, ``down``; none: let every direction flow
        again, the held bytes first, in order)."""
        for way, event in self.flowing.items():
            if way in ways:
                event.clear()
            else:
                event.set()

    async def close(self) -> None:
        """Stop listening and abort every connection; returns once every handler ended."""
        self.down = True
        self.hold()
        self.cut()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

