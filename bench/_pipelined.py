"""The product's log writer with its publishes pipelined: how a bench builds a long run fast.

:class:`baton.log.LogWriter` waits for each record's acknowledgement before it publishes the
next (its compare chain needs the sequence the last one got). On a loaded 2-core machine that
round trip is most of the cost: a 200,000-chunk run took over 20 minutes to write. A bench
that alone writes to its stream knows each sequence in advance (JetStream numbers the records
of a stream one after the other in the order they arrive), so :class:`PipelinedNats` answers
the writer's publish at once with the sequence the record will get and checks every real
acknowledgement as it comes. The writer is the product's own (its headers, message ids,
fences, snapshot rule and snapshot parts), and nats-server still checks each record's
``Nats-Expected-Last-Subject-Sequence``: a wrong guess is refused by the server and fails the
build (:meth:`PipelinedNats.flush`), never stored. So the stored log is the one the product
would store, byte for byte; only the waiting is gone.

Only for a stream nothing else writes to while it is built (the bench's own).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

#: Publishes in flight at most (each holds one chunk's bytes until acknowledged).
WINDOW = 4096


class _Reply:
    """What the writer reads of an acknowledgement: ``{"seq": N}``."""

    def __init__(self, seq: int) -> None:
        self.data = b'{"stream":"","seq":%d}' % seq


class PipelinedNats:
    """Stands in for the writer's NATS client: publishes to ``prefix`` subjects are answered at
    once with their predicted sequence; every other request (the writer's head reads) waits
    for the publishes before it, then goes through.

    Args:
        nc: the connected client.
        prefix: the subjects whose publishes are pipelined (the run's subject and its
            snapshot subject).
    """

    def __init__(self, nc: Any, prefix: str) -> None:
        self._nc = nc
        self._prefix = prefix
        self._inbox = nc.new_inbox()
        self._seq: int | None = None  # the last sequence handed out
        self._pending: dict[int, str] = {}  # predicted sequence → subject
        self._drained = asyncio.Event()
        self._drained.set()
        self._error: str | None = None
        self._sub: Any = None

    async def __aenter__(self) -> "PipelinedNats":
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_ack, pending_msgs_limit=4 * WINDOW)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                await self.flush()
        finally:
            await self._sub.unsubscribe()

    def new_inbox(self) -> str:
        return str(self._nc.new_inbox())

    async def _on_ack(self, msg: Any) -> None:
        seq = int(msg.subject.rsplit(".", 1)[1])
        self._pending.pop(seq, None)
        resp = json.loads(msg.data)
        if resp.get("error") is not None or resp.get("seq") != seq or resp.get("duplicate"):
            self._error = self._error or f"record predicted at {seq} got {resp}"
        if len(self._pending) < WINDOW // 2 or not self._pending:
            self._drained.set()

    async def flush(self) -> None:
        """Wait until every publish was acknowledged.

        Raises:
            RuntimeError: a record was refused or stored at another sequence than predicted.
        """
        while self._pending and self._error is None:
            self._drained.clear()
            await self._nc.flush()
            if self._pending:
                async with asyncio.timeout(60):
                    await self._drained.wait()
        if self._error is not None:
            raise RuntimeError(f"the pipelined build diverged: {self._error}")

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5,
                      headers: dict[str, str] | None = None, **kw: Any) -> Any:
        if self._error is not None:
            raise RuntimeError(f"the pipelined build diverged: {self._error}")
        if not subject.startswith(self._prefix) or self._seq is None:
            await self.flush()  # a read sees every record before it
            reply = await self._nc.request(subject, payload, timeout=timeout, headers=headers, **kw)
            if subject.startswith(self._prefix):  # the first publish (the fence): learn the sequence
                self._seq = int(json.loads(reply.data)["seq"])
            return reply
        while len(self._pending) >= WINDOW:
            self._drained.clear()
            async with asyncio.timeout(60):
                await self._drained.wait()
        self._seq += 1
        self._pending[self._seq] = subject
        await self._nc.publish(subject, payload, reply=f"{self._inbox}.{self._seq}", headers=headers)
        return _Reply(self._seq)
