"""Hostile input: what a client can send must get a clear 4xx, never a 500.

Real coordinator and gateway (no host needed: every case is refused or read-only).
"""
from __future__ import annotations

import asyncio

import pathlib
import urllib.parse
from typing import Any

import httpx

from baton.coordinator_client import CoordinatorClient
from baton.v1 import runs_pb2
from gateway._service import MAX_JSON_DEPTH, check_agent
from tests.conftest import unique
from tests.gateway.conftest import Gateway, claude_journal


def nested(depth: int) -> bytes:
    """A JSON object whose ``messages`` hold ``depth`` nested arrays (valid JSON, deeper than
    Python's recursion limit)."""
    return (b'{"threadId":"t","messages":[{"role":"user","content":' + b"[" * depth + b"]" * depth + b"}]}")


async def test_deeply_nested_json_body_is_a_400_not_a_500(gateway: Gateway, http: httpx.AsyncClient) -> None:
    body = nested(100_000)  # ~200 kB: under the body limit
    for path in ("/api/chat?runId=" + unique("deep"), "/api/chat/cancel"):
        r = await http.post(f"{gateway.url}{path}", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert r.json()["reason"] == "INVALID_ARGUMENT" and r.json()["field"] == "body"


async def test_run_and_thread_ids_with_a_slash_are_readable(gateway: Gateway, http: httpx.AsyncClient,
                                                            cc: CoordinatorClient) -> None:
    # Ids may hold any printable character (baton.ids), "/" included; the record and the
    # transcript routes must serve them like any other id (percent-encoded in the path).
    run_id, thread_id = unique("a/b/") + "/..", unique("th/") + "/x"
    _rec, created = await cc.create_or_resume_run(runs_pb2.RunRecord(
        run_id=run_id, thread_id=thread_id, agent=runs_pb2.AgentSpec(kind="replay"), detach_on_disconnect=True))
    assert created
    r = await http.get(f"{gateway.url}/api/runs/{urllib.parse.quote(run_id, safe='')}")
    assert r.status_code == 200, r.text
    assert r.json()["runId"] == run_id and r.json()["threadId"] == thread_id
    r = await http.get(f"{gateway.url}/api/threads/{urllib.parse.quote(thread_id, safe='')}/messages")
    assert r.status_code == 200, r.text
    assert r.json()["messages"] == []


async def test_a_symlink_out_of_the_replay_dirs_is_never_offered(make_gateway: Any, http: httpx.AsyncClient,
                                                                 tmp_path: pathlib.Path) -> None:
    # A link inside the allowed directory that resolves outside it is not a journal we may
    # read: /api/agents must not offer it and a request naming no agent must not get it as
    # the default (the host would refuse a request the client never got wrong).
    allowed, outside = tmp_path / "replay", tmp_path / "outside"
    (allowed / "claude-stream-json").mkdir(parents=True)
    (outside / "claude-stream-json").mkdir(parents=True)
    (outside / "claude-stream-json" / "private.jsonl").write_text(claude_journal(["not yours"]))
    (allowed / "claude-stream-json" / "a-link.jsonl").symlink_to(outside / "claude-stream-json" / "private.jsonl")
    (allowed / "claude-stream-json" / "hello.jsonl").write_text(claude_journal(["hello"]))
    gw = await make_gateway(replay_dirs=(allowed,))
    offered = [a.get("journal") for a in (await http.get(f"{gw.url}/api/agents")).json()["agents"]]
    assert offered == ["claude-stream-json/hello.jsonl", None, None], offered
    default = check_agent(None, [allowed], "replay")
    assert default.options["journal"] == str((allowed / "claude-stream-json" / "hello.jsonl").resolve())


# --- Durable Streams (/ds) -------------------------------------------------------------------


async def test_a_deeply_nested_json_append_is_the_protocols_400(gateway: Gateway, http: httpx.AsyncClient) -> None:
    # Past Python's recursion limit the parser itself used to fail (500 INTERNAL); depth is
    # checked before parsing, at the same limit as /api/chat's.
    url = f"{gateway.url}/ds/{unique('deep')}"
    json_ct = {"Content-Type": "application/json"}
    assert (await http.put(url, headers=json_ct)).status_code == 201
    for depth in (100_000, MAX_JSON_DEPTH + 1):
        r = await http.post(url, content=b"[" * depth + b"]" * depth, headers=json_ct)
        assert r.status_code == 400, (depth, r.status_code, r.text)
        assert r.text == f"Invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels"
    # Brackets inside strings are text, not nesting; the limit itself is accepted.
    ok = [b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, b'{"a":"' + b"[{" * 5000 + b'\\""}']
    for body in ok:
        r = await http.post(url, content=body, headers=json_ct)
        assert r.status_code == 204, r.text
    r = await http.put(f"{gateway.url}/ds/{unique('deep')}", content=b"[" * 100_000 + b"]" * 100_000,
                       headers=json_ct)
    assert r.status_code == 400 and r.text.startswith("Invalid JSON: nested deeper"), r.text


async def test_stream_names_with_control_characters_are_refused_before_anything_is_made(
        gateway: Gateway, http: httpx.AsyncClient) -> None:
    for escape in ("%00", "%0A", "%0D", "%0d%0a", "%1F", "%7F", "%09"):
        name = f"/ds/{unique('z')}{escape}b"
        r = await http.put(f"{gateway.url}{name}")
        assert r.status_code == 400, (escape, r.status_code, r.text)
        assert r.text == "Invalid stream path: control characters are not allowed"
        assert "location" not in r.headers
        # Nothing was created under the name, nor under the name with the character dropped.
        for path in (name, name.replace(escape, "")):
            assert (await http.head(f"{gateway.url}{path}")).status_code in (400, 404), path


async def test_stream_names_with_dot_segments_are_refused(gateway: Gateway, http: httpx.AsyncClient) -> None:
    # Sent as is (clients, browsers and proxies would rewrite them): no stream may take such a
    # name, which nobody could name again and which a normalising proxy would send elsewhere.
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    base = unique("dots")
    for path in (f"/ds/{base}/../runs/evil", f"/ds/./{base}", f"/ds/{base}/%2e%2E/x", f"/ds/{base}/%2E",
                 f"/ds/{base}/.."):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"PUT {path} HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400 "), (path, answer[:200])
        assert answer.endswith(b"Invalid stream path: '.' and '..' segments are not allowed"), answer[-200:]
    # Dots inside a segment are names like any other.
    for name in (f"{base}/v1.2", f"{base}/...", f"{base}/.hidden"):
        assert (await http.put(f"{gateway.url}/ds/{name}")).status_code == 201, name


async def test_location_names_the_stream_and_never_the_clients_host(gateway: Gateway,
                                                                    http: httpx.AsyncClient) -> None:
    name = f"/ds/{unique('loc')}/a%2Fb"
    r = await http.put(f"{gateway.url}{name}", headers={"Host": "evil.example"})
    assert r.status_code == 201, r.text
    location = r.headers["location"]
    assert "evil.example" not in location
    assert location == f"{gateway.url}{name}"  # the address the gateway listens on, the path as sent


async def test_duplicate_authorization_headers_are_refused(make_gateway: Any, http: httpx.AsyncClient) -> None:
    # Two keys (two tenants): which one counts must never depend on which one a layer reads.
    gw = await make_gateway(api_keys={"ka": "alpha", "kb": "beta"})
    twice = [("Authorization", "Bearer ka"), ("Authorization", "Bearer kb")]
    same_twice = [("Authorization", "Bearer ka"), ("Authorization", "Bearer ka")]
    for headers in (twice, same_twice):
        for method, path in (("GET", "/api/threads"), ("PUT", f"/ds/{unique('s')}"),
                             ("POST", f"/ds/{unique('s')}")):
            r = await http.request(method, f"{gw.url}{path}", headers=headers)
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert "one Authorization header" in r.text, r.text
    # One header still works.
    assert (await http.get(f"{gw.url}/api/threads", headers=[("Authorization", "Bearer ka")])).status_code == 200
