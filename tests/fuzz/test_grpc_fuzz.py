"""Fuzz the gateway's gRPC port: every method of ``baton.v1.Runs`` (gateway/_grpc.py), health
and reflection, with valid messages built from the request descriptors and with corrupt
bytes, sent through a generic channel (no serializers: the bytes go out as drawn).

Properties, for every input: a status other than UNKNOWN, INTERNAL or DATA_LOSS (a stream
may also still be open when left); UNAVAILABLE only with a documented reason (no host);
and afterwards the seeded runs, records, transcripts and streams read back unchanged.
"""
from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf import descriptor as d
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from grpc_status import rpc_status

from baton.v1 import runs_pb2, runs_service_pb2 as pb
import pytest

from tests.fuzz import _strategies as S
from tests.fuzz._harness import Budget, Finding, Tally, conclude, log, run_batch, fuzz_timeout
from tests.fuzz.conftest import Names, World, assert_unchanged

NAMES = Names("grpc")
SURFACE = "grpc"
DEFAULT_EXAMPLES = 3000
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]

RUNS = pb.DESCRIPTOR.services_by_name["Runs"]
METHODS: list[d.MethodDescriptor] = [
    *RUNS.methods, *health_pb2.DESCRIPTOR.services_by_name["Health"].methods,
    *reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].methods,
]
#: Methods that change stored data: the owner of the seeded data sends them new ids only.
WRITES = {"StartRun", "CancelRun", "ForkThread", "DeleteThread", "AnswerApproval", "SteerRun", "CancelQueuedRun"}
BAD = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS}
#: UNAVAILABLE reasons a healthy cluster without sandbox hosts gives (docs/api.md).
UNAVAILABLE_REASONS = {"NO_HOST_AVAILABLE"}
#: gRPC metadata is printable ASCII: the HTTP suite's non-ASCII credential cannot be sent.
AUTH_CHOICES = [a for a in NAMES.auth_choices if all(v.isascii() for v in a)]

_ID_FIELDS = {"run_id", "thread_id", "new_thread_id", "parent_run_id", "approval_id", "input_id"}


def _json_text(plausible: S.Gen[Any]) -> S.Gen[str]:
    """JSON as a proto string: plausible or hostile, always valid UTF-8 (lone surrogates
    travel as ``\\ud800`` escapes, as a protobuf string cannot hold them)."""
    return S.one_of(lambda r: S.encode_json(plausible(r), True).decode(),
                    lambda r: S.json_bodies(S.json_values)(r).decode("utf-8", "replace"),
                    lambda r: S.nested(r.choice([65, 1000, 100_000]), r.choice(["array", "object"])).decode(),
                    weights=(6, 2, 1))


def _utf8(g: S.Gen[str]) -> S.Gen[str]:
    return lambda r: g(r).encode("utf-8", "replace").decode()


def strings_for(may_seed: bool) -> Callable[[d.FieldDescriptor], S.Gen[str]]:
    ids = _utf8(S.ids([*NAMES.run_ids, *NAMES.thread_ids] if may_seed else ()))
    messages = S.lists(S.objects({"id": ids, "role": S.sampled(["user", "assistant", "tool", ""]),
                                  "content": S.hostile_text}), 3)
    by_name: dict[str, S.Gen[str]] = {
        "messages_json": _json_text(messages), "options_json": _json_text(S.AGENT),
        "updated_input_json": _json_text(S.json_values), "after_offset": _utf8(S.OFFSETS),
        "multitask": S.sampled(["reject", "enqueue", "interrupt", "steer", "", "x"]),
        "kind": S.sampled(["replay", "claude-code", "codex", "", "shell"]),
        "git": S.sampled(["https://git.example.com/a.git", "file:///etc", "-oProxyCommand=x", ""]),
        "dir": S.sampled(["/", "/tmp/../etc", "relative", ""]), "service": S.sampled(["", RUNS.full_name, "x"]),
        "file_containing_symbol": S.sampled([RUNS.full_name, "baton.v1.RunInfo", "x", ""]),
        "file_by_filename": S.sampled(["baton/v1/runs_service.proto", "x", ""]),
    }

    def strings(field: d.FieldDescriptor) -> S.Gen[str]:
        if field.name in _ID_FIELDS:
            return ids
        named = by_name.get(field.name)
        plain = _utf8(S.one_of(S.hostile_text, S.long_text, weights=(9, 1)))
        return S.one_of(named, plain, weights=(4, 1)) if named else plain

    return strings


def _valid(method: str) -> Message | None:
    """A request the method accepts (the base that sparse random messages are merged into)."""
    if method == "StartRun":
        return pb.RunStartRequest(
            thread_id="fz-t", run_id="fz-r", messages_json='[{"id":"u1","role":"user","content":"hi"}]',
            agent=runs_pb2.AgentSpec(kind="replay", options_json='{"journal":"claude-stream-json/hello.jsonl","speed":0}'))
    return None


@dataclasses.dataclass(frozen=True)
class GrpcInput:
    gateway: str
    method: str           # /package.Service/Method
    kind: str             # "unary" | "stream" | "bidi"
    payload: bytes
    metadata: tuple[tuple[str, str], ...]
    corrupt: bool         # drawn as corrupt bytes (may still parse)
    parses: bool          # the request type parses the payload


def _generators() -> dict[tuple[str, bool], S.Gen[Message]]:
    out: dict[tuple[str, bool], S.Gen[Message]] = {}
    for may_seed in (True, False):
        strings = strings_for(may_seed)
        for m in METHODS:
            random_msg = S.messages(m.input_type, strings)
            base = _valid(m.name)
            if base is None:
                out[(m.full_name, may_seed)] = random_msg
                continue

            def merged(r: random.Random, base: Message = base, random_msg: S.Gen[Message] = random_msg) -> Message:
                msg = type(base)()
                msg.CopyFrom(base)
                msg.thread_id, msg.run_id = S.plausible_id(r), S.plausible_id(r)  # type: ignore[attr-defined]
                msg.MergeFrom(random_msg(r))
                return msg

            out[(m.full_name, may_seed)] = S.one_of(random_msg, merged)
    return out


GENERATORS = _generators()
REQUEST_TYPES = {m.full_name: message_factory.GetMessageClass(m.input_type) for m in METHODS}


def grpc_input(r: random.Random) -> GrpcInput:
    gateway = r.choice(["auth", "auth", "open"])
    auth = r.choice(AUTH_CHOICES[1:3]) if r.random() < 0.5 else r.choice(AUTH_CHOICES)
    m = r.choice(METHODS)
    owner = gateway == "open" or any(NAMES.key_a in v for v in auth)
    gen = GENERATORS[(m.full_name, m.name not in WRITES or not owner)]

    def valid_bytes(r: random.Random) -> bytes:
        return gen(r).SerializeToString()

    corrupt = r.random() < 0.3
    payload = S.corrupt(valid_bytes)(r) if corrupt else valid_bytes(r)
    try:
        REQUEST_TYPES[m.full_name].FromString(payload)
        parses = True
    except DecodeError:
        parses = False
    kind = "bidi" if m.client_streaming else "stream" if m.server_streaming else "unary"
    path = f"/{m.containing_service.full_name}/{m.name}"
    metadata = tuple(("authorization", v) for v in auth)
    return GrpcInput(gateway, path, kind, payload, metadata, corrupt, parses)


def _reason(err: grpc.aio.AioRpcError) -> str:
    """The ``ErrorInfo`` reason of a failed call ("" without one)."""
    try:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
    except ValueError:
        return "(bad status details)"
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


async def _send(channel: grpc.aio.Channel, x: GrpcInput, stream_grace: float) -> tuple[str, str, str]:
    """→ (status code name or "LIVE", ErrorInfo reason, details)."""
    md = x.metadata
    try:
        if x.kind == "unary":
            await channel.unary_unary(x.method, None, None)(x.payload, metadata=md, timeout=15)
            return "OK", "", ""
        if x.kind == "stream":
            call: Any = channel.unary_stream(x.method, None, None)(x.payload, metadata=md, timeout=30)
        else:
            async def one() -> AsyncIterator[bytes]:
                yield x.payload
            call = channel.stream_stream(x.method, None, None)(one(), metadata=md, timeout=30)
        try:
            async with asyncio.timeout(stream_grace):
                async for _ in call:
                    pass
        except TimeoutError:
            call.cancel()
            return "LIVE", "", ""
        return (await call.code()).name, "", ""
    except grpc.aio.AioRpcError as err:
        return err.code().name, _reason(err), err.details() or ""


def judge_grpc(channels: dict[str, grpc.aio.Channel]) -> Any:
    async def judge(i: int, x: GrpcInput) -> tuple[str, Finding | None]:
        t0 = time.monotonic()
        code, reason, details = await _send(channels[x.gateway], x, stream_grace=1.0)
        name = x.method.rsplit("/", 1)[1]
        label = f"{name} {'corrupt ' if x.corrupt else ''}{code}"
        log({"surface": SURFACE, "i": i, "label": label, "s": round(time.monotonic() - t0, 3), "reason": reason,
             "details": details[:200], "parses": x.parses})
        problem = None
        if code in {c.name for c in BAD}:
            problem = f"{code} {details[:200]!r}"
        elif code == "UNAVAILABLE" and reason not in UNAVAILABLE_REASONS:
            problem = f"UNAVAILABLE ({reason or 'no ErrorInfo'}) {details[:200]!r}"
        elif code == "DEADLINE_EXCEEDED" and name != "CancelRun":
            problem = f"no answer within the deadline {details[:200]!r}"
        if problem is None:
            return label, None
        request = f"[{x.gateway}] {x.method} metadata={list(x.metadata)} payload={x.payload[:300]!r}"
        return label, Finding(i, request, problem, None)

    return judge


@pytest.mark.timeout(fuzz_timeout())
async def test_grpc_fuzz(world: World) -> None:
    budget = Budget.from_env(DEFAULT_EXAMPLES)
    inputs = S.draw(grpc_input, budget.examples, budget.seed, SURFACE)
    before = await world.snapshot()
    tally: Tally[GrpcInput] = Tally(SURFACE)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{world.auth.state.grpc_port}", options=CHANNEL_OPTIONS) as a, \
            grpc.aio.insecure_channel(f"127.0.0.1:{world.open.state.grpc_port}", options=CHANNEL_OPTIONS) as o:
        await run_batch(tally, inputs, judge_grpc({"auth": a, "open": o}), budget)
    tally.notes["corrupt_inputs"] = sum(1 for x in inputs[: tally.tried] if x.corrupt)
    tally.notes["corrupt_inputs_that_parse"] = sum(1 for x in inputs[: tally.tried] if x.corrupt and x.parses)
    await assert_unchanged(world, before)
    conclude(tally, budget)


def test_message_generator_sets_every_field_of_every_request_type() -> None:
    # The generator reaches every field (a field it never set would never be fuzzed).
    seen: dict[str, set[str]] = {m.full_name: set() for m in METHODS}
    for i in range(300):
        r = random.Random(f"cover:{i}")
        for m in METHODS:
            msg = GENERATORS[(m.full_name, True)](r)
            seen[m.full_name] |= {f.name for f, _ in msg.ListFields()}
    missing = {k: sorted({f.name for f in REQUEST_TYPES[k].DESCRIPTOR.fields} - v) for k, v in seen.items()}
    assert not any(missing.values()), missing
