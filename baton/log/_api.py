"""The few raw JetStream API calls the delivery log needs beyond nats-py's helpers.

Reads of single records go to ``$JS.API.STREAM.MSG.GET`` (answered by the stream leader,
so never stale, unlike direct gets served by replicas) and parse the header block
ourselves (nats-py's e-mail parser mangles UTF-8 values such as unicode run ids).
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import nats.js.errors
from nats.aio.client import Client as NATS

from baton.log._headers import parse_header_block

# JetStream error codes (nats-server ``server/errors.json``).
ERR_WRONG_LAST_SEQUENCE = 10071
ERR_NO_MESSAGE_FOUND = 10037
ERR_STREAM_NAME_IN_USE = 10058
ERR_CONSUMER_NOT_FOUND = 10014
# A publish refused for lack of storage: 10023 "insufficient resources" (the server's
# max_file_store is reached; seen with nats-server 2.15) and 10047 "insufficient storage
# resources available" (an account or reservation limit).
ERR_INSUFFICIENT_RESOURCES = 10023
ERR_STORAGE_RESOURCES_EXCEEDED = 10047
STORAGE_FULL_CODES = frozenset({ERR_INSUFFICIENT_RESOURCES, ERR_STORAGE_RESOURCES_EXCEEDED})


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
