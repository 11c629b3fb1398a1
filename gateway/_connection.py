"""Connection hygiene of the gateway's HTTP port: how long a client may take to send a
request head or a request body, and how many connections one client address may hold.

uvicorn bounds only the idle time between two requests (``timeout_keep_alive``): a
connection that opens and sends nothing, sends its head a byte at a time, or stops in the
middle of its body is held for ever. :func:`uvicorn_options` gives uvicorn a subclass of its
httptools protocol with three additions, each a timer or a counter on the event loop (no
task per connection):

- **head deadline**: the request head (request line and headers) must be complete within
  ``header_timeout`` seconds of the connection opening, or of the previous response
  ending; otherwise the connection is closed. A total budget, not an idle timer, so a
  client dripping one byte at a time is closed too.
- **body stall**: while a request body is being received, ``body_timeout`` seconds without
  a byte answer ``408 REQUEST_TIMEOUT`` (or just close, once the app has started its
  response). Time the gateway itself stops reading (backpressure) or spends before it asks
  for the body (``Expect: 100-continue``) is not the client's and does not count.
  Responses are never timed: an SSE stream lives as long as its reader.
- **per-client cap**: at most ``per_client`` connections open at once from one client IP
  address (the peer address of the TCP connection: behind a proxy or NAT every client of
  it shares one address, so size the cap for the proxy, or set 0). Past it, a new
  connection is answered ``429 TOO_MANY_CONNECTIONS`` and closed at once.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class ConnectionLimits:
    """The HTTP port's connection limits (``BATON_HTTP_*``).

    Attributes:
        header_timeout: seconds a connection may take to send a complete request head
            (from its opening, or from the end of its previous response); 0 = no limit.
        body_timeout: seconds a request body may go without a byte; 0 = no limit.
        per_client: connections open at once from one client IP address; 0 = no limit.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    per_client: int = 256


#: Seconds a connection over the per-client cap waits for its request's head before the 429
#: goes anyway, and then for the rest of the request (read and dropped) before it closes.
REFUSAL_WAIT = 1.0
#: Bytes of a refused connection's request read (and dropped) before it is closed at once.
REFUSAL_DRAIN = 1 << 20


def _refusal(status: int, phrase: str, reason: str, message: str) -> bytes:
    """A complete ``connection: close`` response with the gateway's JSON error body."""
    body = json.dumps({"error": message, "reason": reason}).encode()
    return (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class _GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of :class:`ConnectionLimits`.

    One subclass per server (:func:`uvicorn_options`): ``open_per_client`` counts that
    server's connections by client address, on its event loop only (no lock needed).
    """

    limits: ClassVar[ConnectionLimits]
    open_per_client: ClassVar[dict[str, int]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._counted: str | None = None  # the address this connection is counted under
        self._refusal: bytes | None = None  # the answer of a connection over the per-client cap
        self._refusal_sent = False
        self._refusal_timer: asyncio.TimerHandle | None = None
        self._refused_bytes = 0
        self._refused_tail = b""

    # -- the per-client cap -------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = self.limits.per_client
        ip = self.client[0] if self.client else None  # None: a unix socket
        if cap and ip is not None:
            held = self.open_per_client.get(ip, 0)
            if held >= cap:
                # Answered once the request's head is in (a client whose request is still
                # on its way when the socket closes gets a reset, not the 429).
                self._refusal = _refusal(
                    429, "Too Many Requests", "TOO_MANY_CONNECTIONS",
                    f"this address already holds {held} connections, the most one client may hold")
                self._refusal_timer = self.loop.call_later(REFUSAL_WAIT, self._refuse)
                return
            self.open_per_client[ip] = held + 1
            self._counted = ip
        self._arm_head()

    def data_received(self, data: bytes) -> None:
        if self._refusal is None:
            super().data_received(data)
            return
        # A refused connection: its bytes are read and dropped, never parsed.
        self._refused_bytes += len(data)
        seen = self._refused_tail + data
        self._refused_tail = seen[-3:]
        if not self._refusal_sent and b"\r\n\r\n" in seen:
            self._refuse()
        elif self._refused_bytes > REFUSAL_DRAIN:
            self.transport.close()

    def _refuse(self) -> None:
        """Send the refusal, stop writing, and close after :data:`REFUSAL_WAIT` seconds: the
        rest of the request (a body) is read and dropped meanwhile, so the close resets nothing."""
        if self._refusal is None or self._refusal_sent or self.transport.is_closing():
            return
        self._refusal_sent = True
        if self._refusal_timer is not None:
            self._refusal_timer.cancel()
        self.transport.write(self._refusal)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._refusal_timer = self.loop.call_later(REFUSAL_WAIT, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self._refusal_timer is not None:
            self._refusal_timer.cancel()
            self._refusal_timer = None
        ip, self._counted = self._counted, None
        if ip is not None:
            left = self.open_per_client[ip] - 1
            if left:
                self.open_per_client[ip] = left
            else:
                del self.open_per_client[ip]
        super().connection_lost(exc)

    # -- the head deadline --------------------------------------------------------------

    def _arm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        if self.limits.header_timeout > 0:
            self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            # No answer: the client may not even have begun a request (an idle connection).
            self.transport.close()

    def on_headers_complete(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()
        self._arm_body()  # cancelled by on_message_complete when there is no body

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next head's budget starts now, unless it is already here (pipelined).
        if not self.transport.is_closing() and not self.pipeline:
            self._arm_head()

    # -- the body stall -----------------------------------------------------------------

    def _arm_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if self.limits.body_timeout > 0:
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_late)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm_body()

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def _body_late(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            # The gateway is not reading (backpressure) or has not asked for the body yet.
            self._arm_body()
            return
        if not cycle.response_started:
            self.transport.write(_refusal(
                408, "Request Timeout", "REQUEST_TIMEOUT",
                f"the request body sent nothing for {self.limits.body_timeout:g} s"))
        # The app's receive() now gets http.disconnect, and its send() writes nothing more.
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None


def http_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class enforcing ``limits`` (give one server one class: its
    per-client counts live on it)."""
    return type("GatewayHttp", (_GuardedHttp,), {"limits": limits, "open_per_client": {}})


def uvicorn_options(limits: ConnectionLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords that apply ``limits``: ``http`` (the protocol class)
    and ``ws="none"`` (the gateway serves no WebSocket; an upgraded connection would leave
    the limits' bookkeeping)."""
    return {"http": http_protocol(limits), "ws": "none"}
