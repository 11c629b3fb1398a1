"""etcd's gRPC errors as baton's (:func:`translate`), for the etcd adapter's modules."""
from __future__ import annotations

import grpc

from baton.errors import StoreRefused, StoreUnavailable


class LeaseNotFound(Exception):
    """etcd does not know the lease (expired or revoked)."""

    def __init__(self, lease_id: int) -> None:
        self.lease_id = lease_id
        super().__init__(f"lease {lease_id:x} not found")


#: gRPC codes that mean "etcd did not answer (now)": the caller may retry.
_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.ABORTED})


def translate(exc: grpc.aio.AioRpcError, lease_id: int = 0) -> Exception:
    """The domain error for a failed etcd call (every gRPC status maps to one).

    ``NOT_FOUND`` "lease not found" → :class:`LeaseNotFound`; unreachable, too slow,
    leader changes → :class:`StoreUnavailable`; everything else (``RESOURCE_EXHAUSTED``
    for a response over the receive limit or a full quota, ``OUT_OF_RANGE`` for a compacted
    revision, ``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``, ...) → :class:`StoreRefused`.
    """
    code = exc.code()
    details = exc.details() or ""
    if code == grpc.StatusCode.NOT_FOUND and "lease not found" in details:
        return LeaseNotFound(lease_id)
    if code in _TRANSIENT:
        return StoreUnavailable(f"etcd {code.name.lower()}: {details}")
    return StoreRefused(code.name, details)
