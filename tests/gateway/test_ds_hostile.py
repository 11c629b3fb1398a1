"""Hostile input to /ds that once answered 500 (found by the fuzz suite, tests/fuzz): a clear
4xx or a correct answer now, and nothing stored by a refused request."""
from __future__ import annotations

import httpx

from tests.conftest import unique
from tests.gateway.conftest import Gateway


async def test_a_created_stream_s_location_is_its_path_as_sent(gateway: Gateway, http: httpx.AsyncClient) -> None:
    # The Location header was the decoded path: a 500 (no latin-1 header) for a name holding
    # "%E6%97%A5", after the stream was created; and another stream's URL for "%2F".
    for escaped in ("%E6%97%A5", "a%2Fb", "%ff", "%F0%9F%99%82%2F.."):
        url = f"{gateway.url}/ds/{unique('loc')}/{escaped}"
        r = await http.put(url, headers={"Content-Type": "text/plain"}, content=b"one")
        assert r.status_code == 201, (escaped, r.status_code, r.text)
        assert r.headers["location"] == url
        assert (await http.post(r.headers["location"], headers={"Content-Type": "text/plain"},
                                content=b" two")).status_code == 204
        got = await http.get(url, params={"offset": "-1"})
        assert got.status_code == 200 and got.content == b"one two", (escaped, got.status_code, got.content)


async def test_json_with_a_lone_surrogate_escape_is_a_400(gateway: Gateway, http: httpx.AsyncClient) -> None:
    # "\ud800" parses to a str UTF-8 cannot encode: the store's encode raised (500).
    json_ct = {"Content-Type": "application/json"}
    url = f"{gateway.url}/ds/{unique('sur')}"
    r = await http.put(url, headers=json_ct, content=b'["ok", "\\ud800"]')
    assert r.status_code == 400, (r.status_code, r.text)
    assert (await http.head(url)).status_code == 404  # nothing created
    assert (await http.put(url, headers=json_ct, content=b'["ok"]')).status_code == 201
    for body in (b'"\\udfff"', b'[{"k\\udc00": 1}]', b'["a", "\\ud83d"]'):
        r = await http.post(url, headers=json_ct, content=body)
        assert r.status_code == 400, (body, r.status_code, r.text)
    got = await http.get(url, params={"offset": "-1"})
    assert got.status_code == 200 and got.json() == ["ok"]
