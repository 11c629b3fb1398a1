"""The few raw JetStream API calls the delivery log needs beyond nats-py's helpers.

Reads of single records go to ``$JS.API.STREAM.MSG.GET`` (answered by the stream leader,
so never stale, unlike direct gets served by replicas) and parse the header block
ourselves (nats-py's e-mail parser mangles UTF-8 values such as unicode run ids). The one
batched read, :func:`direct_batch`, is a direct get: its caller checks that the answer
reaches a sequence it knows is stored (a lagging replica answers short, never wrong).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from baton.log._headers import parse_header_block

# JetStream error codes (nats-server ``server/errors.json``).
ERR_WRONG_LAST_SEQUENCE = 10071
# The same refusal from a replicated stream's leader when a record for the subject is still
# in flight there (``JSStreamWrongLastSequenceConstantErr``, no sequence in its text): the
# compare is not decided yet, so the head may still be the expected one.
ERR_WRONG_LAST_SEQUENCE_IN_FLIGHT = 10164
ERR_NO_MESSAGE_FOUND = 10037
ERR_STREAM_NAME_IN_USE = 10058
ERR_CONSUMER_NOT_FOUND = 10014
# A publish refused for lack of storage: 10023 "insufficient resources" (the server's
# max_file_store is reached; seen with nats-server 2.15) and 10047 "insufficient storage
# resources available" (an account or reservation limit).
ERR_INSUFFICIENT_RESOURCES = 10023
ERR_STORAGE_RESOURCES_EXCEEDED = 10047
STORAGE_FULL_CODES = frozenset({ERR_INSUFFICIENT_RESOURCES, ERR_STORAGE_RESOURCES_EXCEEDED})

_STATUS = "Status"
_DESCRIPTION = "Description"
_SEQUENCE = "Nats-Sequence"


@dataclass(frozen=True)
class RawRecord:
    """A stored message: stream sequence, headers, body, and when JetStream stored it
    (Unix seconds; ``0.0`` when the answer did not say)."""

    seq: int
    headers: dict[str, str]
    data: bytes
    stored_at: float = 0.0


async def _msg_get(nc: NATS, stream: str, req: dict[str, Any], timeout: float) -> RawRecord | None:
    resp = await nc.request(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps(req).encode(), timeout=timeout)
    body = json.loads(resp.data)
    err = body.get("error")
    if err is not None:
        if err.get("err_code") == ERR_NO_MESSAGE_FOUND:
            return None
        raise nats.js.errors.APIError.from_error(err)
    m = body["message"]
    hdrs = parse_header_block(base64.b64decode(m["hdrs"])) if m.get("hdrs") else {}
    data = base64.b64decode(m["data"]) if m.get("data") else b""
    return RawRecord(seq=int(m["seq"]), headers=hdrs, data=data, stored_at=_unix(m.get("time")))


def _unix(rfc3339: str | None) -> float:
    """JetStream's message ``time`` (RFC 3339, nanoseconds, ``Z``) as Unix seconds; 0.0 if absent or bad."""
    if not rfc3339:
        return 0.0
    try:
        return datetime.fromisoformat(rfc3339).timestamp()
    except ValueError:
        return 0.0


async def last_on_subject(nc: NATS, stream: str, subject: str, timeout: float = 5.0) -> RawRecord | None:
    """The last stored record of ``subject``, or ``None`` when it has none.

    Raises:
        nats.js.errors.APIError: for any other API failure (e.g. the stream is missing).
        nats.errors.TimeoutError: when JetStream does not answer within ``timeout`` seconds.
    """
    return await _msg_get(nc, stream, {"last_by_subj": subject}, timeout)


async def first_on_subject(
    nc: NATS, stream: str, subject: str, start: int = 1, timeout: float = 5.0
) -> RawRecord | None:
    """The first stored record of ``subject`` with sequence >= ``start``, or ``None``."""
    return await _msg_get(nc, stream, {"seq": max(start, 1), "next_by_subj": subject}, timeout)


async def direct_batch(nc: NATS, stream: str, subject: str, *, up_to: int, max_bytes: int,
                       timeout: float = 5.0, start: int = 1) -> list[RawRecord]:
    """The records of ``subject`` from its first (at or after ``start``) up to ``up_to`` (inclusive), in order, from
    one batched direct get (``$JS.API.DIRECT.GET``, nats-server 2.11+): no consumer.

    The answer may stop early: at about ``max_bytes`` of records, or at whatever a replica
    serving direct gets has applied so far (they may lag the stream leader). The caller
    tells a complete answer by its last sequence and reads the rest another way.

    Raises:
        nats.errors.TimeoutError: the batch did not end within ``timeout`` seconds.
        nats.js.errors.APIError: an error status other than "no message".
    """
    loop = asyncio.get_running_loop()
    out: list[RawRecord] = []
    ended: asyncio.Future[tuple[str, str]] = loop.create_future()

    async def on_msg(msg: Msg) -> None:
        hdrs = msg.headers or {}
        status = hdrs.get(_STATUS)
        if status is not None and not msg.data:
            if not ended.done():
                ended.set_result((status, hdrs.get(_DESCRIPTION, "")))
            return
        seq = hdrs.get(_SEQUENCE)
        if seq is not None and not ended.done():
            out.append(RawRecord(seq=int(seq), headers=hdrs, data=msg.data))

    sub = await nc.subscribe(nc.new_inbox(), cb=on_msg, pending_msgs_limit=0, pending_bytes_limit=0)
    try:
        req = {"seq": max(start, 1), "next_by_subj": subject, "up_to_seq": up_to, "batch": max(up_to, 1),
               "max_bytes": max_bytes}
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(req).encode(), reply=sub.subject)
        try:
            async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancel on 3.11
                status, description = await ended
        except TimeoutError:
            raise nats.errors.TimeoutError from None
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    if status not in ("204", "404"):  # 204: end of the batch; 404: nothing in the range
        raise nats.js.errors.APIError(code=int(status) if status.isdigit() else None, description=description)
    return [r for r in out if r.seq <= up_to]


async def record_at(nc: NATS, stream: str, seq: int, timeout: float = 5.0) -> RawRecord | None:
    """The record at stream sequence ``seq``, or ``None`` when there is none (deleted, expired)."""
    return await _msg_get(nc, stream, {"seq": seq}, timeout)
