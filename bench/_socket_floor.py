"""The socket floor of ``bench/sandbox_daemon.py``: the most any network path in Python gets
out of loopback here, with nothing of gRPC, HTTP/2 or the daemon in it.

``python -m bench._socket_floor`` listens on a free loopback TCP port (printed on stdout). Each
connection sends an 8-byte big-endian byte count ``n`` and a path; the server answers with the
file's first ``n`` bytes by ``socket.sendfile`` (the kernel's ``sendfile(2)``: page cache to
socket, no copy through Python) and closes. :func:`read` is the client side, blocking (run it
in a thread): ``recv_into`` one reused buffer, each piece copied out as ``bytes`` as any
consumer that keeps what it got must do. Over that, a network path only adds work.
"""
from __future__ import annotations

import socket
import threading

#: The client's receive buffer (bytes): one piece at most, as the daemon's chunks.
PIECE = 1 << 20


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            raise ConnectionError("the client went away mid-request")
        buf += got
    return buf


def _answer(conn: socket.socket) -> None:
    with conn:
        n = int.from_bytes(_recv_exact(conn, 8), "big")
        size = int.from_bytes(_recv_exact(conn, 2), "big")
        path = _recv_exact(conn, size).decode()
        with open(path, "rb") as f:
            conn.sendfile(f, 0, n)


def read(port: int, path: str, n: int) -> int:
    """Bytes received of the first ``n`` bytes of ``path`` served on ``port`` (blocking).

    Raises:
        ConnectionError: the server closed before ``n`` bytes.
    """
    buf = bytearray(PIECE)
    view = memoryview(buf)
    keep = 0
    with socket.create_connection(("127.0.0.1", port)) as conn:
        raw = path.encode()
        conn.sendall(n.to_bytes(8, "big") + len(raw).to_bytes(2, "big") + raw)
        got = 0
        while got < n:
            k = conn.recv_into(view)
            if not k:
                raise ConnectionError(f"the server closed after {got} of {n} bytes")
            keep += len(bytes(view[:k]))  # the copy out any consumer makes
            got += k
    return keep


def _serve() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    print(srv.getsockname()[1], flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_answer, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    _serve()
