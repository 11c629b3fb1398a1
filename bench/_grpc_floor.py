"""The floor of ``bench/sandbox_daemon.py``: the least a Python gRPC stream on baton's stack
does per MiB, with nothing of the daemon in it.

``python -m bench._grpc_floor`` serves one unary-stream method on a free loopback port (printed
on stdout): the request's big-endian 8-byte count ``n``, answered with ``n`` messages of one
pre-built 1 MiB ``bytes`` (identity serializers: no protobuf, no file, no executor hop), with the
daemon's server options and allocator setting. :func:`read` is the client side.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import grpc

from baton.malloc_tuning import retain_freed_memory

METHOD = "/bench.Floor/Stream"
_PAYLOAD = b"x" * (1 << 20)
_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.http2.max_frame_size", (1 << 24) - 1)]
#: The daemon client's channel options (sandbox_host/providers/_daemon_client.py).
CLIENT_OPTIONS = [*_OPTIONS, ("grpc.max_send_message_length", 64 << 20)]


def _identity(b: bytes) -> bytes:
    return b


async def _stream(request: bytes, _context: object) -> AsyncIterator[bytes]:
    for _ in range(int.from_bytes(request, "big")):
        yield _PAYLOAD


async def _serve() -> None:
    server = grpc.aio.server(options=_OPTIONS)
    handler = grpc.unary_stream_rpc_method_handler(_stream, request_deserializer=_identity,
                                                   response_serializer=_identity)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Floor", {"Stream": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


async def read(channel: grpc.aio.Channel, mib: int) -> int:
    """Bytes received for a stream of ``mib`` messages of 1 MiB."""
    call = channel.unary_stream(METHOD, request_serializer=_identity, response_deserializer=_identity)
    n = 0
    async for data in call(mib.to_bytes(8, "big")):
        n += len(data)
    return n


if __name__ == "__main__":
    retain_freed_memory()
    asyncio.run(_serve())
