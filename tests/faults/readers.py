"""A browser tab on one run: ``POST /api/chat`` or a join, reconnecting with ``Last-Event-ID``
until the log's end marker, recording when each chunk arrived (for recovery times)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from tests.faults.harness import FaultRun

#: A reader that gets nothing (not even a keep-alive) for this long reconnects.
READ_TIMEOUT = 10.0
RECONNECT_PAUSE = 0.2


@dataclass
class Received:
    """One ``(offset, chunk, arrival)`` per chunk a reader got, across its reconnects."""

    items: list[tuple[str | None, dict[str, Any], float]] = field(default_factory=list)
    ended: bool = False
    ended_at: float | None = None
    reconnects: int = 0
    #: ``(status, body)`` of every refused request (5xx and 4xx), in order.
    refusals: list[tuple[int, str]] = field(default_factory=list)
    #: SSE comments other than keep-alives and the end marker (notices).
    comments: list[str] = field(default_factory=list)

    @property
    def last_offset(self) -> str | None:
        for off, _, _ in reversed(self.items):
            if off is not None:
                return off
        return None

    @property
    def offsets(self) -> list[str]:
        return [o for o, _, _ in self.items if o is not None]

    def first_after(self, t: float) -> float | None:
        """Arrival time of the first chunk (or the end) after ``t``."""
        for _, _, at in self.items:
            if at > t:
                return at
        return self.ended_at if self.ended_at is not None and self.ended_at > t else None



class Reader:
    """A browser tab on one run: ``POST /api/chat`` (or a ``GET`` join), then, whenever the
    stream drops or the gateway refuses with a 5xx before the log ended, a ``GET`` with
    ``Last-Event-ID`` (the POST itself again while nothing arrived yet)."""

    def __init__(self, http: httpx.AsyncClient, base: str, run: "FaultRun") -> None:
        self.http, self.base, self.run = http, base, run
        self.got = Received()
        self.task: asyncio.Task[None] | None = None
        #: Set once the first chunk arrived (the run started, its log is readable).
        self.first_chunk = asyncio.Event()

    def start(self, *, post: bool = True) -> "Reader":
        self.task = asyncio.create_task(self._loop(post), name=f"reader:{self.run.run_id}")
        return self

    async def stop(self) -> None:
        """Drop the connection (a closed laptop): the run goes on, detached."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def wait(self) -> None:
        if self.task is not None:
            await self.task

    async def _loop(self, post: bool) -> None:
        while not self.got.ended:
            resume = self.got.last_offset
            headers = {"Accept": "text/event-stream"}
            if resume is not None:
                headers["Last-Event-ID"] = resume
            if post and resume is None:
                req = self.http.build_request("POST", f"{self.base}/api/chat", json=self.run.body,
                                              headers={**headers, "X-Run-Id": self.run.run_id})
            else:
                params = {"runId": self.run.run_id}
                if resume is None:
                    params["offset"] = "-1"
                req = self.http.build_request("GET", f"{self.base}/api/chat", params=params, headers=headers)
            try:
                resp = await self.http.send(req, stream=True)
                try:
                    if resp.status_code >= 400:
                        await resp.aread()
                        self.got.refusals.append((resp.status_code, resp.text))
                        if resp.status_code < 500:
                            raise AssertionError(f"{req.method} /api/chat for {self.run.run_id}: "
                                                 f"{resp.status_code} {resp.text}")
                    else:
                        await self._read_sse(resp)
                finally:
                    await resp.aclose()
            except httpx.TransportError:
                pass  # dropped, refused or silent too long: reconnect below, like a browser
            if not self.got.ended:
                self.got.reconnects += 1
                await asyncio.sleep(RECONNECT_PAUSE)

    async def _read_sse(self, resp: httpx.Response) -> None:
        offset: str | None = None
        data: list[str] = []
        async for line in resp.aiter_lines():
            if line == "":
                if data:
                    self.got.items.append((offset, json.loads("\n".join(data)), time.monotonic()))
                    self.first_chunk.set()
                offset, data = None, []
            elif line.startswith(":"):
                text = line[1:].strip()
                if text == "end":
                    self.got.ended, self.got.ended_at = True, time.monotonic()
                elif text and text not in ("keep-alive", "keepalive", "ping"):
                    self.got.comments.append(text)
            elif line.startswith("id:"):
                offset = line[3:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
