"""Fuzz the Durable Streams surface (``/ds``, docs/api.md): PUT, POST, GET, DELETE, HEAD and
others on random and seeded stream paths, with the protocol's headers (Content-Type,
Stream-Seq, Stream-TTL, producers, forks, offsets) and bodies, with and without credentials.

Properties, for every input: a complete HTTP response; no 500, and a 5xx only for a tenant
limit (507); and afterwards the seeded streams (tenant A's) and runs read back unchanged.
Fuzzed writes go to a small pool of paths, so creates, appends, reads, forks and deletes of
the same streams interleave.
"""
from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import pytest

from tests.fuzz import _strategies as S
from tests.fuzz._harness import Budget, Finding, Tally, conclude, log, run_batch, fuzz_timeout
from tests.fuzz._raw_http import Outcome, Request, encode_segment, exchange, header_value
from tests.fuzz.conftest import Names, World, assert_unchanged

NAMES = Names("ds")
SURFACE = "ds"
DEFAULT_EXAMPLES = 4000
WRITE_METHODS = ("PUT", "POST", "DELETE")
METHODS = ["PUT", "POST", "POST", "POST", "GET", "GET", "DELETE", "HEAD", "OPTIONS", "PATCH", "FOO"]
AUTH_CHOICES = NAMES.auth_choices

#: The paths fuzzed writes go to (tenant A's seeded ones only when the writer is not tenant A).
POOL = [f"/fzp/{i}" for i in range(12)] + ["/fzp/%2Fa", "/fzp/a%2F", "/fzp/%C3%A9", "/fzp//x", "/fzp/x/"]
POOL_TYPES = ["application/json", "text/plain", "application/octet-stream"]
ODD_PATHS = ["", "/", "//", "/..", "/a/../b", "/%2e%2e/x", "/%00", "/z%00b", "/%ff", "/@x/y", "/runs", "/runs/",
             "/runs/%00", "/runs/x/y", "/.", "/%", "/%zz", "/a?b", "/*", "/>", "/a b"]
CONTENT_TYPES = ["application/json", "application/json", "text/plain", "application/octet-stream",
                 "application/json; charset=utf-8", "text/plain;charset=x", "x", "/", "a/b/c", "",
                 "application/x-ndjson", "APPLICATION/JSON"]
NUMBERS = S.one_of(S.sampled(["0", "1", "-1", "01", "1.5", "", " ", "9007199254740992", "99999999999999999999",
                              "abc", "1e3", "\u0661"]), lambda r: str(r.randint(0, 50)))
OFFSETS = S.one_of(S.sampled(["-1", "now", "0", "", "-2", "0000000000000000_0000000000000000",
                              "0000000000000000_9999999999999999", "9999999999999999_0000000000000000", "1_1",
                              "00000000000000000000000000000000_1", "a_b", "_", "%00"]),
                   lambda r: f"{0:016d}_{r.randint(0, 200):016d}", S.hostile_text)


@dataclasses.dataclass(frozen=True)
class DsInput:
    gateway: str
    request: Request


def ds_input(r: random.Random) -> DsInput:
    gateway = r.choice(["auth", "auth", "open"])
    # Mostly one valid key: a refused credential stops a request before the protocol.
    auth = r.choice(AUTH_CHOICES[1:3]) if r.random() < 0.6 else r.choice(AUTH_CHOICES)
    method = r.choice(METHODS)
    owner = gateway == "open" or any(NAMES.key_a in v for v in auth)
    may_seed = method not in WRITE_METHODS or not owner or gateway == "open"  # open: another namespace
    paths: list[S.Gen[str]] = [S.sampled(POOL), S.sampled(ODD_PATHS),
                               lambda r: "/fzp/" + encode_segment(S.hostile_text(r), r.randint(0, 3)),
                               lambda r: "/runs/" + encode_segment(S.ids(NAMES.run_ids)(r), r.randint(0, 3))]
    if may_seed:
        paths.append(S.sampled(NAMES.streams))
    path = S.one_of(*paths, weights=(8, 2, 2, 2, 3)[: len(paths)])(r)
    # Each stream of the pool is made with one content type (by its index): most writes to
    # it send that type, so appends get past the type check.
    usual = POOL_TYPES[POOL.index(path) % len(POOL_TYPES)] if path in POOL else None
    headers: list[tuple[bytes, bytes]] = [(b"authorization", v.encode("latin-1")) for v in auth]

    def maybe_header(p: float, name: str, value: S.Gen[str]) -> None:
        if r.random() < p:
            headers.append((name.encode(), header_value(value(r))))

    body = b""
    if method in ("PUT", "POST", "PATCH", "FOO") or r.random() < 0.05:
        maybe_header(0.9, "content-type", S.sampled(CONTENT_TYPES) if usual is None or r.random() < 0.2
                     else S.just(usual))
        kind = r.random()
        if usual == "application/json" and kind < 0.5:
            kind = 0.0
        if kind < 0.35:
            body = S.encode_json(S.lists(S.json_values, 4)(r), S.booleans(r))
        elif kind < 0.5:
            body = S.json_bodies(S.json_values)(r)
        elif kind < 0.53:
            body = S.nested(r.choice([1000, 5000, 100_000]), r.choice(["array", "object"]))
        elif kind < 0.535:
            body = b"x" * r.choice([999_999, 1_000_000, 1_000_001])
        elif kind < 0.8:
            body = S.binary(64)(r)
    maybe_header(0.2, "stream-seq", NUMBERS)
    maybe_header(0.1, "stream-ttl", NUMBERS)
    maybe_header(0.05, "stream-expires-at", S.sampled(["2030-01-01T00:00:00Z", "2000-01-01T00:00:00Z", "x", "",
                                                       "2030-13-45T99:99:99Z", "1e10"]))
    maybe_header(0.15, "stream-closed", S.sampled(["true", "false", "TRUE", "1", ""]))
    if r.random() < 0.15:
        maybe_header(0.9, "producer-id", S.one_of(S.sampled(["p1", "p2"]), S.hostile_text))
        maybe_header(0.9, "producer-epoch", NUMBERS)
        maybe_header(0.9, "producer-seq", NUMBERS)
    if method == "PUT" and r.random() < 0.2:
        maybe_header(1.0, "stream-forked-from", S.sampled([*NAMES.streams, *POOL, "", "/", "/runs/x", "@x/y"]))
        maybe_header(0.5, "stream-fork-offset", OFFSETS)
        maybe_header(0.2, "stream-fork-sub-offset", NUMBERS)
    maybe_header(0.05, "if-none-match", S.sampled(['"x"', "*", "", '"0000000000000000_0000000000000000"']))
    query = ""
    if method in ("GET", "HEAD") or r.random() < 0.05:
        parts = []
        if r.random() < 0.8:
            parts.append("offset=" + encode_segment(OFFSETS(r), r.randint(0, 3)))
        if r.random() < 0.3:
            parts.append("live=" + r.choice(["long-poll", "sse", "true", "", "x"]))
        if r.random() < 0.1:
            parts.append("cursor=" + encode_segment(S.hostile_text(r), 0))
        if r.random() < 0.05:
            parts.append(encode_segment(S.hostile_text(r), 0) + "=" + encode_segment(S.hostile_text(r), 0))
        query = "?" + "&".join(parts) if parts else ""
    target = ("/ds" + path + query).encode("latin-1")
    return DsInput(gateway, Request(method, target, tuple(headers), body))


def _problem(x: DsInput, out: Outcome) -> tuple[str, str | None] | None:
    """(what broke, the known defect it is) or ``None``."""
    if not out.complete:
        return f"no complete response ({out.error})", None
    if out.status == 507 and out.body.startswith(b"DS_"):
        return None
    if out.status >= 500:
        return f"{out.status} {out.body[:300]!r}", None
    return None


def nesting(body: bytes) -> int:
    """How deep the JSON arrays and objects of ``body`` nest (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in body:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (0x5D, 0x7D):
            depth -= 1
    return deepest


def judge_ds(world: World) -> Any:
    ports = {"auth": world.auth.server.config.port, "open": world.open.server.config.port}

    async def judge(i: int, x: DsInput) -> tuple[str, Finding | None]:
        t0 = time.monotonic()
        out = await exchange(ports[x.gateway], x.request, timeout=20, stream_grace=1.0)
        label = f"{x.request.method} " + ("dropped" if not out.complete else f"{out.status}" + (" live" if out.live else ""))
        found = _problem(x, out)
        log({"surface": SURFACE, "i": i, "label": label, "s": round(time.monotonic() - t0, 3),
             "request": x.request.describe(120), "answer": out.body[:200].decode("latin-1")})
        if found is None:
            return label, None
        what, known = found
        return label, Finding(i, f"[{x.gateway}] {x.request.describe()}", what, known)

    return judge


@pytest.mark.timeout(fuzz_timeout())
async def test_durable_streams_fuzz(world: World) -> None:
    budget = Budget.from_env(DEFAULT_EXAMPLES)
    inputs = S.draw(ds_input, budget.examples, budget.seed, SURFACE)
    before = await world.snapshot()
    tally: Tally[DsInput] = Tally(SURFACE)
    await run_batch(tally, inputs, judge_ds(world), budget)
    await assert_unchanged(world, before)
    conclude(tally, budget)
