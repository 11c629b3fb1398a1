"""Bearer API keys → tenants (docs/design.md §6, ``BATON_API_KEYS``).

With no keys configured every caller is the empty tenant ``""`` and sees everything. With
keys, every route but health and the static page needs ``Authorization: Bearer <key>``; a
tenant sees only its own threads and runs, and anything else answers 404 (never 403: the
existence of another tenant's run is not disclosed).
"""
from __future__ import annotations

import hmac
from typing import Mapping, Sequence

from starlette.requests import Request

from baton import errors as e
from baton.v1 import runs_pb2
from gateway._errors import SeveralCredentials, Unauthorized


def tenant_of(request: Request, api_keys: Mapping[str, str]) -> str:
    """The caller's tenant.

    Args:
        request: the HTTP request.
        api_keys: configured key → tenant; empty disables auth.

    Returns:
        The tenant, or ``""`` when auth is disabled.

    Raises:
        Unauthorized: auth is enabled and the header is missing, sent more than once, or
            the key unknown.
    """
    if not api_keys:
        return ""
    return tenant_of_header(one_authorization(request.headers.getlist("authorization")), api_keys)


def one_authorization(values: Sequence[str]) -> str:
    """The one ``Authorization`` value of a request (``""`` when it sends none).

    Several are refused, whatever they say: which one counts must not depend on which one a
    layer (a proxy, Starlette, grpc) happens to read, first or last.

    Raises:
        SeveralCredentials: more than one value.
    """
    if len(values) > 1:
        raise SeveralCredentials()
    return values[0] if values else ""


def tenant_of_header(header: str, api_keys: Mapping[str, str]) -> str:
    """The tenant of an ``Authorization`` value (HTTP header or gRPC ``authorization`` metadata).

    Returns:
        The tenant, or ``""`` when auth is disabled (``api_keys`` empty).

    Raises:
        Unauthorized: auth is enabled and the value is missing or the key unknown.
    """
    if not api_keys:
        return ""
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized()
    key = key.strip()
    # Compare every configured key in constant time so timing does not reveal a prefix.
    found = ""
    for known, tenant in api_keys.items():
        if hmac.compare_digest(known.encode(), key.encode()):
            found = tenant
    if not found:
        raise Unauthorized()
    return found


def check_run_visible(record: runs_pb2.RunRecord, tenant: str, auth_enabled: bool) -> None:
    """Raise ``UnknownRun`` when ``tenant`` may not see ``record`` (other tenants get 404)."""
    if auth_enabled and record.tenant != tenant:
        raise e.UnknownRun(record.run_id)
