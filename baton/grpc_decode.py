"""A gRPC server interceptor that answers a request which does not parse with
``INVALID_ARGUMENT``, for every method of a server (ours, grpcio's health and reflection).

grpcio decodes a request with the method's ``request_deserializer`` before any handler
runs, and answers a ``DecodeError`` there with ``UNKNOWN`` ("Unexpected <class
'google.protobuf.message.DecodeError'>"): a client's fault reported as the server's. This
interceptor takes the decoding into the handler: the method is served with no deserializer
(it receives bytes), decodes them itself and aborts ``INVALID_ARGUMENT`` naming the message
type when they do not parse. Place it after the credential check in the server's
interceptor list, so a caller without credentials is refused before its bytes are read.

Streaming handlers of both styles are kept: an async generator's items are written with
``context.write``, a coroutine that writes itself is awaited.

A unary request's handler that fails leaves the frames it passed through without their
locals (:func:`baton.errors.drop_frames`): grpcio keeps the error in a reference cycle
until a collection, and the request must not wait there with it.
"""
from __future__ import annotations

import inspect
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from baton.errors import drop_frames

Deserializer = Callable[[bytes], Any]


async def _decode(deserialize: Deserializer, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    try:
        return deserialize(raw)
    except Exception:  # noqa: BLE001 -- DecodeError, or whatever a custom deserializer raises on bad bytes
        name = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
        what = f"a valid {name.full_name} message" if name is not None else "a valid request message"
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: is not {what}")


async def _stream_out(result: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    if inspect.isasyncgen(result):
        async for item in result:
            await context.write(item)
    elif inspect.isawaitable(result):
        await result


def _decoded(deserialize: Deserializer, raw_requests: AsyncIterator[bytes],
             context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
    async def gen() -> AsyncIterator[Any]:
        async for raw in raw_requests:
            yield await _decode(deserialize, raw, context)
    return gen()


def decode_in_handler(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` served without a deserializer, decoding (and refusing bad bytes) itself;
    returned unchanged when it has no deserializer."""
    deserialize = handler.request_deserializer
    if deserialize is None:
        return handler
    out = handler.response_serializer
    h: Any = handler  # grpc-stubs type the behaviours as sync ones
    if h.unary_unary is not None:
        uu = h.unary_unary

        async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            request = await _decode(deserialize, raw, context)
            del raw
            try:
                return await uu(request, context)
            except BaseException as exc:
                del request  # this frame stays in the error's traceback: not the request
                drop_frames(exc)
                raise
        return grpc.unary_unary_rpc_method_handler(unary_unary, response_serializer=out)
    if h.unary_stream is not None:
        us = h.unary_stream

        async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            request = await _decode(deserialize, raw, context)
            del raw
            try:
                await _stream_out(us(request, context), context)
            except BaseException as exc:
                del request
                drop_frames(exc)
                raise
        return grpc.unary_stream_rpc_method_handler(unary_stream, response_serializer=out)
    if h.stream_unary is not None:
        su = h.stream_unary

        async def stream_unary(raw: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            return await su(_decoded(deserialize, raw, context), context)
        return grpc.stream_unary_rpc_method_handler(stream_unary, response_serializer=out)
    ss = h.stream_stream

    async def stream_stream(raw: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await _stream_out(ss(_decoded(deserialize, raw, context), context), context)
    return grpc.stream_stream_rpc_method_handler(stream_stream, response_serializer=out)


class DecodeCheck(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # generic only in grpc-stubs, not at runtime
    """Every method of the server decodes its requests in the handler (:func:`decode_in_handler`)."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        return handler if handler is None else decode_in_handler(handler)
