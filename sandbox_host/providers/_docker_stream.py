"""An exec's output stream from the Docker Engine API, read and closed through public APIs.

``POST /exec/{id}/start`` (Engine API, without the ``Upgrade`` headers) answers ``200`` with
``application/vnd.docker.raw-stream``: the exec's stdout and stderr multiplexed in frames of
an 8-byte header (stream type, three zero bytes, payload length as a big-endian uint32) and
the payload, until the exec ends. The request goes through the SDK's ``APIClient`` (a
``requests`` session), so this module owns the response: the docker SDK's own
``exec_start(stream=True)`` hides it inside a ``CancellableStream`` whose ``close`` shuts the
socket but leaves the response to the garbage collector.

The calls that block (``open_exec_stream``, :meth:`ExecStream.read`) belong on a thread of
their own; :meth:`ExecStream.shutdown` may be called from any thread.
"""
from __future__ import annotations

import json
import os
import socket
import struct

import docker
import docker.errors
import requests

_HEADER = struct.Struct(">BxxxL")
_READ = 64 * 1024


class FrameDecoder:
    """The payloads of multiplexed frames fed in arbitrary pieces (pure).

    Every stream type is kept, as the SDK's ``exec_start(stream=True)`` keeps them: an exec
    created with ``stderr=False`` has only stdout attached, and an error the engine reports
    inside the stream comes framed too.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> bytes:
        """Append ``data``; return the payload bytes of the frames it completed, in order
        (``b""`` when none is complete)."""
        self._buf += data
        out = bytearray()
        while len(self._buf) >= _HEADER.size:
            _, size = _HEADER.unpack_from(self._buf)
            end = _HEADER.size + size
            if len(self._buf) < end:
                break
            out += self._buf[_HEADER.size:end]
            del self._buf[:end]
        return bytes(out)


class ExecStream:
    """The stdout of a started exec, as bytes. Not thread-safe except :meth:`shutdown`."""

    def __init__(self, response: requests.Response) -> None:
        self._response = response
        self._frames = FrameDecoder()

    def read(self) -> bytes | None:
        """Block until stdout bytes arrive; ``None`` once the stream ended (the exec exited,
        the connection dropped, or :meth:`shutdown` was called)."""
        while True:
            try:
                data = self._response.raw.read1(_READ)
            except (OSError, ValueError, requests.exceptions.RequestException):
                return None
            if not data:
                return None
            out = self._frames.feed(data)
            if out:
                return out

    def shutdown(self) -> None:
        """Shut the connection down, which ends a :meth:`read` blocked in another thread.

        Through a duplicate of the socket's descriptor: a shutdown acts on the connection,
        whichever descriptor names it, and closing the duplicate leaves the response's own.
        """
        raw = self._response.raw
        if raw.closed:
            return  # the stream ended: nothing blocks on it
        try:
            fd = raw.fileno()
        except (OSError, ValueError, AttributeError):  # urllib3: AttributeError once released
            return
        try:
            with socket.socket(fileno=os.dup(fd)) as dup:
                dup.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected any more: nothing to wake

    def close(self) -> None:
        """Release the response and its connection (after the last :meth:`read` returned)."""
        self._response.close()


def open_exec_stream(api: docker.APIClient, exec_id: str) -> ExecStream:
    """Start exec ``exec_id`` (created with ``stdout=True``, no tty) and return its stream.

    Blocks until the engine answers.

    Raises:
        docker.errors.NotFound: the exec or its container is gone.
        docker.errors.APIError: the engine refused (e.g. the container is not running).
    """
    url = f"{api.base_url}/v{api.api_version}/exec/{exec_id}/start"
    response = api.post(url, data=json.dumps({"Detach": False, "Tty": False}),
                        headers={"Content-Type": "application/json"}, stream=True)
    try:
        response.raise_for_status()
    except requests.exceptions.HTTPError as exc:
        response.close()
        docker.errors.create_api_error_from_http_exception(exc)  # raises NotFound, APIError…
        raise  # not reached: the SDK's function always raises
    return ExecStream(response)
