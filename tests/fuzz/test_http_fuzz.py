"""Fuzz the HTTP run API (the /api routes of gateway/app.py, docs/api.md): paths, query
parameters, headers and JSON bodies, hostile and plausible, with and without credentials.

Properties, for every input: a complete HTTP response (no dropped connection, no hang); no
500, and a 5xx only with a documented reason a cluster without hosts gives; and afterwards
the seeded runs, records, transcripts and streams read back unchanged.
"""
from __future__ import annotations

import dataclasses
import json
import random
import time
from typing import Any

import pytest

from tests.fuzz import _strategies as S
from tests.fuzz._harness import Budget, Finding, Tally, conclude, log, run_batch, fuzz_timeout
from tests.fuzz._raw_http import Outcome, Request, encode_segment, exchange, header_value
from tests.fuzz.conftest import Names, World, assert_unchanged

NAMES = Names("http")
SURFACE = "http"
DEFAULT_EXAMPLES = 3000

#: The 5xx answers a healthy cluster with no sandbox host gives (docs/api.md, error table).
ALLOWED_5XX = {(503, "NO_HOST_AVAILABLE"), (503, "HOST_AT_CAPACITY"), (504, "CANCEL_WAIT_TIMEOUT")}
READ_METHODS = ("GET", "HEAD", "OPTIONS")


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    template: str                      # {run}, {thread}, {approval}, {any}: path parameters
    query: tuple[str, ...] = ()        # parameter names it reads
    body: dict[str, S.Gen[Any]] | None = None  # field -> generator of its plausible values
    valid: S.Gen[dict[str, Any]] | None = None  # a body the route accepts


def _message(idst: S.Gen[str]) -> S.Gen[Any]:
    return S.objects({"id": idst, "role": S.sampled(["user", "assistant", "system", "tool", "developer", ""]),
                      "content": S.one_of(S.hostile_text, S.long_text, S.lists(S.objects({
                          "type": S.sampled(["text", "image", "binary"]), "text": S.hostile_text}), 2)),
                      "toolCallId": idst, "parts": S.lists(S.json_values, 2)})


def routes(idst: S.Gen[str]) -> list[Route]:
    """The routes, their parameters, and generators of their body fields (ids from ``idst``)."""
    chat = {"threadId": idst, "runId": idst, "messages": S.lists(_message(idst), 4),
            "agent": S.AGENT, "workspace": S.WORKSPACE, "detachOnDisconnect": S.booleans,
            "interruptActive": S.booleans, "parentRunId": idst,
            "multitask": S.sampled(["reject", "enqueue", "interrupt", "steer", "", "x"]),
            "forwardedProps": S.objects({"workspace": S.WORKSPACE, "agent": S.AGENT}),
            "tools": S.lists(S.json_values, 2), "context": S.lists(S.json_values, 2), "state": S.json_values}
    new = S.plausible_id

    def valid_chat(r: random.Random) -> dict[str, Any]:
        return {"threadId": new(r), "runId": new(r),
                "messages": [{"id": "u1", "role": "user", "content": S.hostile_text(r)}],
                "agent": {"kind": "replay", "journal": "claude-stream-json/hello.jsonl", "speed": 0}}
    return [
        Route("POST", "/api/chat", ("runId", "format", "threadId"), chat, valid_chat),
        Route("GET", "/api/chat", ("runId", "offset", "threadId", "format", "keepTtl")),
        Route("GET", "/api/chat/active", ("threadId",)),
        Route("POST", "/api/chat/cancel", ("wait",), {"runId": idst, "threadId": idst, "wait": S.booleans,
                                                     "timeoutSeconds": S.floats()}, lambda r: {"runId": idst(r)}),
        Route("POST", "/api/runs/{run}/approvals/{approval}", (), {
            "approved": S.booleans, "message": S.one_of(S.hostile_text, S.long_text), "updatedInput": S.json_values},
            lambda r: {"approved": S.booleans(r), "message": "ok", "updatedInput": {"command": "ls"}}),
        Route("POST", "/api/runs/{run}/messages", (), {"content": S.one_of(S.hostile_text, S.long_text), "id": idst},
              lambda r: {"content": S.hostile_text(r) or "x", "id": f"m{r.randint(0, 99)}"}),
        Route("POST", "/api/runs/{run}/keep", (), {"ttlSeconds": S.floats()}, lambda r: {"ttlSeconds": 60}),
        Route("GET", "/api/runs/{run}"),
        Route("GET", "/api/threads/{thread}/messages"),
        Route("DELETE", "/api/threads/{thread}/queue/{run}"),
        Route("GET", "/api/threads/{thread}/queue"),
        Route("POST", "/api/threads/{thread}/fork", (), {"runId": idst, "newThreadId": idst},
              lambda r: {"runId": idst(r), "newThreadId": new(r)}),
        Route("DELETE", "/api/threads/{thread}"),
        Route("GET", "/api/threads"),
        Route("GET", "/api/threads/{thread}/runs"),
        Route("GET", "/api/ops/overview"),
        Route("GET", "/api/ops/timeline", ("runId",)),
        Route("GET", "/api/agents"),
        Route("GET", "/{any}"),
        Route("GET", "/static/{any}"),
    ]


SEEDED = [*NAMES.run_ids, *NAMES.thread_ids]
#: Ids that may name the seeded data, and ids that are new (see conftest).
IDS = {True: S.ids(SEEDED), False: S.ids()}
ROUTES = {seeded: {(r.method, r.template): r for r in routes(IDS[seeded])} for seeded in (True, False)}
BODIES = {seeded: {k: S.json_bodies(S.one_of(S.objects(r.body), S.mutated(r.valid, r.body)) if r.valid else
                                     S.objects(r.body))
                    for k, r in ROUTES[seeded].items() if r.body is not None}
          for seeded in (True, False)}
ROUTE_KEYS = list(ROUTES[True])
#: The start and the join take the most input: they get more of the budget.
ROUTE_WEIGHTS = [{"POST /api/chat": 4, "GET /api/chat": 3}.get(" ".join(k), 1) for k in ROUTE_KEYS]
AUTH_CHOICES = NAMES.auth_choices
CONTENT_TYPES = ["application/json", "application/json", "text/plain", "application/json; charset=utf-16",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "\xff/\xff"]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "FOO"]


@dataclasses.dataclass(frozen=True)
class HttpInput:
    gateway: str  # "auth" | "open"
    request: Request
    route: str = ""  # the route's method and template (figures only)


def http_input(r: random.Random) -> HttpInput:
    gateway = r.choice(["auth", "auth", "open"])
    auth = r.choice(AUTH_CHOICES)
    key = r.choices(ROUTE_KEYS, ROUTE_WEIGHTS)[0]
    method = key[0] if r.random() < 0.8 else r.choice(METHODS)
    owner = gateway == "open" or any(NAMES.key_a in v for v in auth)
    # The owner may change its own data: its writes name only new ids (see conftest).
    may_seed = method in READ_METHODS or not owner
    idst, route = IDS[may_seed], ROUTES[may_seed][key]
    target = route.template
    for name in ("run", "thread", "approval", "any"):
        if "{" + name + "}" in target:
            target = target.replace("{" + name + "}", encode_segment(idst(r), r.randint(0, 3)))
    query: list[tuple[str, str]] = []
    for q in route.query:
        if r.random() < 0.6:
            value = (S.OFFSETS if q == "offset" else S.sampled(["sse", "ndjson", "x", "true", "1", ""])
                     if q in ("format", "wait") else idst)(r)
            query.append((q, value))
    if r.random() < 0.1:
        query.append((S.hostile_text(r), S.hostile_text(r)))
    how = r.randint(0, 3)
    qs = "&".join(encode_segment(k, how) + "=" + encode_segment(v, how) for k, v in query)
    headers: list[tuple[bytes, bytes]] = [(b"authorization", v.encode("latin-1")) for v in auth]
    body = b""
    if route.body is not None and method not in ("GET", "HEAD"):
        body = BODIES[may_seed][key](r)
        ctype = r.choice(CONTENT_TYPES)
        if ctype:
            headers.append((b"content-type", ctype.encode("latin-1")))
    elif r.random() < 0.1:
        body = S.binary(32)(r)
    if route.template == "/api/chat" and r.random() < 0.4:
        hname = r.choice([b"last-event-id", b"x-run-id"])
        headers.append((hname, header_value((S.OFFSETS if hname == b"last-event-id" else idst)(r))))
    if r.random() < 0.15:
        headers.append((b"accept", r.choice([b"application/x-ndjson", b"text/event-stream", b"*/*", b"\xff"])))
    if r.random() < 0.1:
        hname = r.choice([b"x-fuzz", b"cookie", b"origin", b"range", b"if-none-match", b"accept-encoding"])
        headers.append((hname, bytes(r.randint(0x20, 0xFF) for _ in range(r.randint(0, 40)))))
    path = target + ("?" + qs if qs else "")
    return HttpInput(gateway, Request(method, path.encode("latin-1"), tuple(headers), body), " ".join(key))


def judge_http(world: World, by_route: dict[str, dict[str, int]]) -> Any:
    ports = {"auth": world.auth.server.config.port, "open": world.open.server.config.port}

    async def judge(i: int, x: HttpInput) -> tuple[str, Finding | None]:
        t0 = time.monotonic()
        out = await exchange(ports[x.gateway], x.request, timeout=20, stream_grace=1.0)
        label = "dropped" if not out.complete else f"{out.status} {_reason(out)}".strip()
        seen = by_route.setdefault(x.route, {})
        seen[label] = seen.get(label, 0) + 1
        log({"surface": SURFACE, "i": i, "label": label, "s": round(time.monotonic() - t0, 3),
             "request": x.request.describe(120), "answer": out.body[:200].decode("latin-1")})
        problem = _problem(out)
        if problem is None:
            return label, None
        return label, Finding(i, f"[{x.gateway}] {x.request.describe()}", problem)

    return judge


def _reason(out: Outcome) -> str:
    """The ``reason`` of a JSON error body ("" for anything else)."""
    if out.status < 400 or not out.body or not out.headers.get("content-type", "").startswith("application/json"):
        return ""
    try:
        reason = json.loads(out.body).get("reason")
    except (ValueError, AttributeError):
        return "(unparsable body)"
    return str(reason)


def _problem(out: Outcome) -> str | None:
    if not out.complete:
        return f"no complete response ({out.error})"
    if out.status >= 500:
        if (out.status, _reason(out)) not in ALLOWED_5XX:
            return f"{out.status} {out.body[:300]!r}"
    return None


@pytest.mark.timeout(fuzz_timeout())
async def test_http_api_fuzz(world: World) -> None:
    budget = Budget.from_env(DEFAULT_EXAMPLES)
    inputs = S.draw(http_input, budget.examples, budget.seed, SURFACE)
    before = await world.snapshot()
    tally: Tally[HttpInput] = Tally(SURFACE)
    by_route: dict[str, dict[str, int]] = {}
    await run_batch(tally, inputs, judge_http(world, by_route), budget)
    tally.notes["outcomes_by_route"] = {k: dict(sorted(v.items())) for k, v in sorted(by_route.items())}
    tally.notes["statuses_5xx_allowed"] = sorted(f"{s} {r}" for s, r in ALLOWED_5XX)
    await assert_unchanged(world, before)
    conclude(tally, budget)
