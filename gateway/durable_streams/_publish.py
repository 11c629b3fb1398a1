"""JetStream publishes with acknowledgement, fenced on the subject's last sequence.

A publish to a JetStream subject is a request: the server answers on the reply subject once
the message is stored. The requests go through :class:`baton.log._replies.Replies` (one
reply subscription for every publish of the connection, a future and one timer each), as
the runs' log writer's do: nats-py's ``request`` per publish was a visible share of a
Durable Streams append's Python work.

Not taken, on purpose: writing the publish to nats-py's transport from the publishing task
and taking acks out of its read loop (a hook on a private method) saved about 15% of the
gateway's CPU per append in the bench (ds5's A/B, 7 rounds: 0.380 -> 0.322 ms) and still left
it below the in-memory reference; it would tie this module to nats-py's internals. What
is published and what counts as stored: an append is answered only once JetStream's ack
arrived.
"""
from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from baton.log._replies import Replies

_DECODER = json.JSONDecoder()
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"


class Publisher:
    """Publishes on ``nc`` and waits for JetStream's ack.

    Args:
        nc: a connected NATS client.
        timeout: seconds to wait for an ack (then ``nats.errors.TimeoutError``).
        shared, own, on_other: acks taken under a prefix other publishers share, each
            publisher hearing the others' (:class:`baton.log._replies.Replies`).
    """

    def __init__(self, nc: NATS, timeout: float = 5.0, *, shared: str | None = None, own: str = "",
                 on_other: Callable[[Msg], Awaitable[None]] | None = None) -> None:
        self._replies = Replies(nc, shared=shared, own=own, on_other=on_other)
        self._timeout = timeout

    async def start(self) -> None:
        """Subscribe to this publisher's replies."""
        await self._replies.start()

    async def stop(self) -> None:
        """Unsubscribe and fail every publish still waiting (``nats.errors.TimeoutError``)."""
        await self._replies.close()

    async def publish(self, subject: str, payload: bytes, expected_last_subject_seq: int,
                      tag: str = "") -> dict[str, Any]:
        """Publish, fenced on the subject's last sequence, and return JetStream's ack
        (``{"stream", "seq", ...}``) once stored.

        Args:
            subject: a valid subject (not checked here).
            payload: the message body.
            expected_last_subject_seq: sent as ``Nats-Expected-Last-Subject-Sequence``
                (0: the subject has no message yet).
            tag: subject tokens in the ack's reply subject (with a shared prefix only).

        Raises:
            nats.js.errors.APIError: JetStream refused the message (``err_code`` says why:
                10071 when the subject's last sequence is not the expected one).
            nats.js.errors.NoStreamResponseError: no stream takes ``subject``.
            nats.errors.MaxPayloadError: the message is larger than the server takes.
            nats.errors.TimeoutError: no ack within the timeout (or the publisher stopped).
        """
        try:
            # nats-py refuses a payload over the server's max_payload (MaxPayloadError).
            msg = await self._replies.request(subject, payload, timeout=self._timeout,
                                              headers={_EXPECTED_LAST: str(expected_last_subject_seq)}, tag=tag)
        except nats.errors.NoRespondersError:
            raise nats.js.errors.NoStreamResponseError from None
        ack: dict[str, Any] = _DECODER.decode(msg.data.decode())
        err = ack.get("error")
        if err is not None:
            nats.js.errors.APIError.from_error(err)  # raises the error's class
        return ack
