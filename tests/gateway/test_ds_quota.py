"""Per-tenant Durable Streams limits (gateway/durable_streams/_quota.py): the create or
append past a tenant's stream or byte limit is refused with 507 and writes nothing; other
tenants are not touched; deleting gives the room back; gateways share one count.

Real coordinator, NATS and gateways; each test has tenants of its own (the usage bucket is
shared by the session's gateways, as it is by a deployment's).
"""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import unique


def keys() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Two fresh tenants: (api_keys, headers of tenant A, headers of tenant B)."""
    a, b = unique("ka"), unique("kb")
    return ({a: unique("tenant-a"), b: unique("tenant-b")},
            {"authorization": f"Bearer {a}"}, {"authorization": f"Bearer {b}"})


TEXT = {"content-type": "text/plain"}


async def test_the_stream_past_the_limit_is_refused_and_not_created(
        make_gateway: Any, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_DS_MAX_STREAMS_PER_TENANT", "3")
    api_keys, a, b = keys()
    gw = await make_gateway(api_keys=api_keys)
    url = f"{gw.url}/ds/{unique('s')}"
    for i in range(3):
        assert (await http.put(f"{url}-{i}", headers=a | TEXT)).status_code == 201
    r = await http.put(f"{url}-3", headers=a | TEXT, content=b"hello")
    assert r.status_code == 507, r.text
    assert r.text.startswith("DS_STREAM_LIMIT")
    assert (await http.get(f"{url}-3?offset=-1", headers=a)).status_code == 404
    # An idempotent repeat of a stream it holds is no new stream.
    assert (await http.put(f"{url}-0", headers=a | TEXT)).status_code == 200
    # Another tenant has a count of its own.
    assert (await http.put(f"{url}-3", headers=b | TEXT)).status_code == 201
    # A delete gives the room back.
    assert (await http.delete(f"{url}-0", headers=a)).status_code == 204
    assert (await http.put(f"{url}-3", headers=a | TEXT, content=b"hello")).status_code == 201
    r = await http.get(f"{url}-3?offset=-1", headers=a)
    assert r.status_code == 200 and r.content == b"hello"


async def test_gateways_share_the_count(make_gateway: Any, http: httpx.AsyncClient,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_DS_MAX_STREAMS_PER_TENANT", "3")
    api_keys, a, _ = keys()
    one, two = await make_gateway(api_keys=api_keys), await make_gateway(api_keys=api_keys)
    name = unique("s")
    for i, gw in enumerate((one, two, one)):
        assert (await http.put(f"{gw.url}/ds/{name}-{i}", headers=a | TEXT)).status_code == 201
    r = await http.put(f"{two.url}/ds/{name}-3", headers=a | TEXT)
    assert r.status_code == 507 and r.text.startswith("DS_STREAM_LIMIT"), r.text
    assert (await http.head(f"{one.url}/ds/{name}-3", headers=a)).status_code == 404


async def test_the_bytes_past_the_limit_are_refused_and_not_written(
        make_gateway: Any, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_DS_MAX_BYTES_PER_TENANT", "100")
    api_keys, a, b = keys()
    gw = await make_gateway(api_keys=api_keys)
    url = f"{gw.url}/ds/{unique('s')}"
    assert (await http.put(f"{url}-0", headers=a | TEXT, content=b"x" * 60)).status_code == 201
    assert (await http.post(f"{url}-0", headers=a | TEXT, content=b"y" * 30)).status_code == 204
    r = await http.post(f"{url}-0", headers=a | TEXT, content=b"z" * 20)  # 110 > 100
    assert r.status_code == 507, r.text
    assert r.text.startswith("DS_BYTES_LIMIT")
    r = await http.get(f"{url}-0?offset=-1", headers=a)
    assert r.content == b"x" * 60 + b"y" * 30
    # A create whose first append does not fit: refused, nothing created.
    r = await http.put(f"{url}-1", headers=a | TEXT, content=b"w" * 20)
    assert r.status_code == 507 and r.text.startswith("DS_BYTES_LIMIT"), r.text
    assert (await http.head(f"{url}-1", headers=a)).status_code == 404
    # What still fits is taken; another tenant is not touched.
    assert (await http.post(f"{url}-0", headers=a | TEXT, content=b"z" * 10)).status_code == 204
    assert (await http.put(f"{url}-0", headers=b | TEXT, content=b"b" * 100)).status_code == 201
    # Deleting the stream frees its bytes.
    assert (await http.delete(f"{url}-0", headers=a)).status_code == 204
    assert (await http.put(f"{url}-1", headers=a | TEXT, content=b"w" * 100)).status_code == 201


def test_the_limits_are_read_from_the_environment() -> None:
    from gateway.durable_streams._app import settings_from_env
    from gateway.durable_streams._quota import QuotaLimits

    _, store = settings_from_env({})
    assert store.quota == QuotaLimits(streams=10_000, bytes=10 << 30)
    _, store = settings_from_env({"BATON_DS_MAX_STREAMS_PER_TENANT": "0", "BATON_DS_MAX_BYTES_PER_TENANT": "5"})
    assert store.quota == QuotaLimits(streams=0, bytes=5)
    with pytest.raises(ValueError, match="BATON_DS_MAX_STREAMS_PER_TENANT"):
        settings_from_env({"BATON_DS_MAX_STREAMS_PER_TENANT": "-1"})
