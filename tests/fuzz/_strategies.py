"""Input generators of the fuzz suite: hostile text, ids and JSON, and protobuf messages built
from their descriptors.

A generator is a function of a ``random.Random``: the same seed gives the same inputs on
every machine, drawn in microseconds. (Hypothesis was tried first: drawn up front to be sent
concurrently, its examples cost ~4 ms each and half of them were repeats; run as examples,
one after another, a join of an unknown run alone waits 3 s by design.) Everything here is
pure (no I/O); the surfaces' request generators are in their test modules.
"""
from __future__ import annotations

import json
import math
import random
from typing import Any, Callable, Sequence, TypeVar

from google.protobuf import descriptor as d
from google.protobuf import message_factory
from google.protobuf.message import Message

T = TypeVar("T")
Gen = Callable[[random.Random], T]


# --- combinators ----------------------------------------------------------------------------

def just(value: T) -> Gen[T]:
    return lambda r: value


def sampled(values: Sequence[T]) -> Gen[T]:
    values = list(values)
    return lambda r: r.choice(values)


def one_of(*gens: Gen[Any], weights: Sequence[float] | None = None) -> Gen[Any]:
    """One of ``gens`` (uniformly, or by ``weights``), then its value."""
    if weights is None:
        return lambda r: r.choice(gens)(r)
    return lambda r: r.choices(gens, weights)[0](r)


def lists(g: Gen[T], max_size: int, min_size: int = 0) -> Gen[list[T]]:
    # Small sizes are the common case; the maximum still comes up.
    return lambda r: [g(r) for _ in range(min(r.randint(min_size, max_size), r.randint(min_size, max_size)))]


def maybe(p: float, g: Gen[T], default: T) -> Gen[T]:
    return lambda r: g(r) if r.random() < p else default


def integers(lo: int, hi: int) -> Gen[int]:
    """Any of [lo, hi], edges and small values often."""
    edges = [v for v in (0, 1, -1, 2, lo, hi, lo + 1, hi - 1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1)
             if lo <= v <= hi]
    small = (max(lo, -10), min(hi, 1000))
    return one_of(sampled(edges), lambda r: r.randint(*small), lambda r: r.randint(lo, hi))


def floats() -> Gen[float]:
    return one_of(sampled([0.0, -0.0, 1.0, -1.0, 0.5, 1e-300, 5e-324, 1e308, -1e308, 2.0**53, math.inf, -math.inf,
                           math.nan]),
                  lambda r: r.uniform(-1e6, 1e6), lambda r: r.expovariate(1e-3))


def booleans(r: random.Random) -> bool:
    return r.random() < 0.5


def binary(max_size: int) -> Gen[bytes]:
    return lambda r: r.randbytes(r.randint(0, max_size))


# --- text and ids ---------------------------------------------------------------------------

#: Characters that break naive code: NUL and controls, path and escape characters, a lone
#: surrogate of each half, bidi and line separators, non-characters, astral emoji.
SPECIAL_CHARS = ("\x00", "\x01", "\x1f", "\x7f", "\n", "\r", "\t", " ", "/", "\\", "%", "?", "#", "&", "=", "+",
                 ".", "..", "*", ">", "@", ":", ";", '"', "'", "<", "{", "\ud800", "\udfff", "\u2028", "\u202e",
                 "\ufeff", "\uffff", "\U0010ffff", "é", "日", "🙂", "\u0301")

hostile_char: Gen[str] = one_of(
    sampled(SPECIAL_CHARS),
    lambda r: chr(r.randint(0x20, 0x7E)),
    lambda r: chr(r.randint(0x80, 0xFFFF)),        # the BMP: surrogates ~3% of it
    lambda r: chr(r.randint(0x10000, 0x10FFFF)),
    weights=(3, 4, 2, 1))


def text(chars: Gen[str] = hostile_char, max_size: int = 24, min_size: int = 0) -> Gen[str]:
    return lambda r: "".join(chars(r) for _ in range(r.randint(min_size, max_size)))


hostile_text = text()

#: Strings around the limits of ids (256 bytes of UTF-8) and bodies.
def long_text(r: random.Random) -> str:
    c = r.choice(["a", "é", "🙂", "%"])
    return c * (r.choice([255, 256, 257, 1024, 70_000]) // len(c.encode()))


_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789_-"
def plausible_id(r: random.Random) -> str:
    """A new id a client could well choose."""
    return "fz-" + "".join(r.choice(_ALNUM) for _ in range(r.randint(1, 12)))


def ids(seeded: Sequence[str] = ()) -> Gen[str]:
    """A run/thread/approval id: one of ``seeded`` (ids that exist), a plausible new one, or hostile."""
    plausible = plausible_id
    odd = sampled(["", "a", "/", "//", "..", "a/b", "a/../b", "%00", "%2F", "%252F", "-1", "now", "eof",
                   "\x00", "a\nb", "\ud800", "🙂", " x ", "runs/x", "@t/x", "*", ">", "a.b"])
    if not seeded:
        return one_of(plausible, odd, hostile_text, long_text, weights=(4, 3, 3, 1))
    def near(r: random.Random) -> str:  # a seeded id, nearly
        s = r.choice(seeded)
        return r.choice([s + "/", "/" + s, s + "\x00", s.upper(), s + "%00", s[:-1]])
    return one_of(sampled(seeded), near, plausible, odd, hostile_text, long_text, weights=(5, 2, 4, 3, 3, 1))


# --- JSON -----------------------------------------------------------------------------------

json_scalar: Gen[Any] = one_of(
    just(None), booleans, integers(-(2**70), 2**70), sampled([2**53 + 1, 2**63, -(2**63) - 1, 10**400]),
    floats(), hostile_text, long_text, weights=(1, 1, 2, 1, 2, 4, 1))


def json_value(depth: int = 3) -> Gen[Any]:
    """Any JSON value (NaN and infinities included: Python's encoder writes them), nested
    at most ``depth`` deep."""
    if depth == 0:
        return json_scalar
    inner = json_value(depth - 1)
    return one_of(json_scalar, lists(inner, 4), lambda r: {hostile_text(r): inner(r) for _ in range(r.randint(0, 4))},
                  weights=(3, 1, 1))


json_values = json_value()


def nested(depth: int, kind: str) -> bytes:
    """``depth`` nested arrays or objects (valid JSON, deeper than any parser's recursion)."""
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


#: JSON texts no encoder makes: deep nesting, numbers past every limit, bad escapes, NaN.
odd_json_texts: Gen[bytes] = one_of(
    lambda r: nested(r.choice([64, 1000, 5000, 100_000]), r.choice(["array", "object"])),
    sampled([
        b"1" * 5000, b"-" + b"9" * 4301, b"1e999999", b"-1e-999999", b"NaN", b"Infinity", b"-0",
        b'"\\ud800"', b'"\\udfff\\ud800"', b'"\\u0000"', b'"\\uZZZZ"', b'"\\', b'{"a":"\\ud83d"}',
        b"\xff\xfe{}", b"\xef\xbb\xbf{}", b"{\"a\":1,\"a\":2}", b"{" * 3, b"[1,]", b"{'a':1}", b"", b" ",
        b"null", b"true", b"[]", b"{}", b'"x"', b"\x00", "{\"é\":1}".encode("utf-16"),
    ]))


def encode_json(value: Any, ascii_only: bool) -> bytes:
    """``value`` as JSON bytes; lone surrogates become ``\\uD800`` escapes (``ascii_only``) or
    the bytes UTF-8 forbids (``surrogatepass``)."""
    return json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":")).encode("utf-8", "surrogatepass")


def json_bodies(plausible: Gen[Any]) -> Gen[bytes]:
    """A request body: mostly ``plausible`` values encoded as JSON, then hostile JSON and bytes."""
    def encoded(r: random.Random) -> bytes:
        return encode_json(plausible(r), booleans(r))

    def truncated(r: random.Random) -> bytes:
        b = encoded(r)
        return b[: r.randint(0, max(len(b) - 1, 0))]

    return one_of(encoded, lambda r: encode_json(json_values(r), booleans(r)), odd_json_texts, truncated, binary(64),
                  weights=(10, 2, 2, 1, 1))


def objects(fields: dict[str, Gen[Any]]) -> Gen[dict[str, Any]]:
    """A JSON object with any subset of ``fields`` (each a plausible value, or now and then
    any JSON: the wrong type), sometimes with extra fields."""
    items = list(fields.items())

    def gen(r: random.Random) -> dict[str, Any]:
        keep = r.random()
        out = {k: (g(r) if r.random() < 0.8 else json_values(r)) for k, g in items if r.random() < keep}
        if r.random() < 0.15:
            out = {**{hostile_text(r): json_values(r) for _ in range(r.randint(1, 3))}, **out}
        return out

    return gen


def mutated(valid: Gen[dict[str, Any]], fields: dict[str, Gen[Any]]) -> Gen[dict[str, Any]]:
    """A ``valid`` object with up to two of its fields replaced (by ``fields``' values, or any
    JSON) or removed: inputs that get past the first checks."""
    names = list(fields)

    def gen(r: random.Random) -> dict[str, Any]:
        out = dict(valid(r))
        for _ in range(r.randint(0, 2)):
            k = r.choice(names)
            roll = r.random()
            if roll < 0.15:
                out.pop(k, None)
            else:
                out[k] = fields[k](r) if roll < 0.85 else json_values(r)
        return out

    return gen


# --- plausible values of the run API (docs/api.md) -------------------------------------------

AGENT = objects({"kind": sampled(["replay", "claude-code", "codex", "shell", "", "REPLAY"]),
                   "journal": sampled(["claude-stream-json/hello.jsonl", "../../etc/passwd", "/etc/hostname",
                                         "claude-stream-json/", "claude-stream-json/missing.jsonl", "\x00"]),
                   "speed": one_of(integers(-1, 100), floats()), "model": hostile_text,
                   "maxTurns": integers(-(2**40), 2**40), "allowedTools": lists(hostile_text, 3)})
WORKSPACE = objects({"git": sampled(["https://git.example.com/a.git", "file:///etc", "-oProxyCommand=x",
                                         "ssh://u:p@h/x", "/tmp", "git@h:a/b"]),
                       "dir": sampled(["/", "/tmp/../etc", "relative", "/srv/%2e%2e/x"]),
                       "ref": sampled(["main", "-x", "a b", "HEAD~1"]), "credential": hostile_text,
                       "setup": lists(hostile_text, 40)})
OFFSETS = one_of(sampled(["-1", "now", "0", "1", "-2", "1e3", "", " 1", "0x10", "99999999999999999999999",
                              "0000000000000000_0000000000000001", "%00"]), hostile_text)


# --- protobuf messages from descriptors -----------------------------------------------------

_INT_RANGES = {
    d.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), d.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1), d.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    d.FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1), d.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1), d.FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), d.FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}

StringsFor = Callable[[d.FieldDescriptor], Gen[str]]


def _scalar(field: d.FieldDescriptor, strings: StringsFor, depth: int) -> Gen[Any]:
    t = field.type
    if t == d.FieldDescriptor.TYPE_STRING:
        return strings(field)
    if t == d.FieldDescriptor.TYPE_BYTES:
        return binary(64)
    if t == d.FieldDescriptor.TYPE_BOOL:
        return booleans
    if t in _INT_RANGES:
        return integers(*_INT_RANGES[t])
    if t == d.FieldDescriptor.TYPE_DOUBLE:
        return floats()
    if t == d.FieldDescriptor.TYPE_FLOAT:
        return one_of(sampled([0.0, 1.5, -1.0, math.inf, math.nan]), lambda r: r.uniform(-1e30, 1e30))
    if t == d.FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        known = [v.number for v in field.enum_type.values]
        if field.enum_type.is_closed:
            return sampled(known)
        # An open (proto3) enum carries any int32: values no server knows included.
        return one_of(sampled(known), integers(-(2**31), 2**31 - 1), weights=(3, 1))
    if t in (d.FieldDescriptor.TYPE_MESSAGE, d.FieldDescriptor.TYPE_GROUP):
        assert field.message_type is not None
        return messages(field.message_type, strings, depth + 1)
    raise AssertionError(f"unhandled field type {t} of {field.full_name}")


def messages(desc: d.Descriptor, strings: StringsFor, depth: int = 0) -> Gen[Message]:
    """A valid message of type ``desc``: any subset of its fields set, each oneof at most once,
    strings from ``strings(field)`` (so callers bias ids and JSON fields by name)."""
    cls = message_factory.GetMessageClass(desc)
    if depth > 3:
        return lambda r: cls()
    plain = [f for f in desc.fields if f.containing_oneof is None or f.containing_oneof.name.startswith("_")]
    oneofs = [o for o in desc.oneofs if not o.name.startswith("_")]  # "_x": a proto3 `optional`
    values = {f.name: _scalar(f, strings, depth) for f in desc.fields
              if not (f.message_type is not None and f.message_type.GetOptions().map_entry)}
    maps = {f.name: (_scalar(f.message_type.fields_by_name["key"], strings, depth),
                     _scalar(f.message_type.fields_by_name["value"], strings, depth))
            for f in desc.fields if f.message_type is not None and f.message_type.GetOptions().map_entry}

    def gen(r: random.Random) -> Message:
        msg = cls()
        keep = r.random()
        chosen = [f for f in plain if r.random() < keep]
        for o in oneofs:
            f = r.choice([None, *o.fields])
            if f is not None:
                chosen.append(f)
        for f in chosen:
            target = getattr(msg, f.name)
            if f.name in maps:
                kg, vg = maps[f.name]
                for _ in range(r.randint(0, 3)):
                    k, v = kg(r), vg(r)
                    if isinstance(v, Message):
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif f.is_repeated:
                items = [values[f.name](r) for _ in range(r.randint(0, 3))]
                if f.message_type is not None:
                    for v in items:
                        target.add().CopyFrom(v)
                else:
                    target.extend(items)
            elif f.message_type is not None:
                target.CopyFrom(values[f.name](r))
            else:
                setattr(msg, f.name, values[f.name](r))
        return msg

    return gen


def corrupt(valid: Gen[bytes]) -> Gen[bytes]:
    """Bytes near a valid encoding: truncated, a byte flipped, garbage appended; a few
    hand-made broken encodings (a length past the end, invalid UTF-8 in a string, an
    11-byte varint, a group marker); or just random bytes."""
    def truncated(r: random.Random) -> bytes:
        b = valid(r)
        return b[: r.randint(0, max(len(b) - 1, 0))]

    def flipped(r: random.Random) -> bytes:
        b = bytearray(valid(r) or b"\x00")
        i = r.randrange(len(b))
        b[i] ^= r.randint(1, 255)
        return bytes(b)

    return one_of(
        binary(64), truncated, flipped, lambda r: valid(r) + r.randbytes(r.randint(1, 16)),
        sampled([
            b"\x0a\xff\xff\xff\xff\x0f",      # field 1, length 4 GiB
            b"\x0a\x02\xc3\x28",              # field 1, invalid UTF-8
            b"\x0a\x01\xff",                  # field 1, a lone 0xff
            b"\x0a\x03\xed\xa0\x80",          # field 1, an encoded surrogate
            b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # an 11-byte varint
            b"\x0b", b"\x0c", b"\x0f",        # start/end group, wire type 7
            b"\x00", b"\xff" * 8, b"\x12\x00" * 1000, b"\x0a",
        ]))


def draw(gen: Gen[T], n: int, seed: int, salt: str) -> list[T]:
    """``n`` inputs of ``gen``: input ``i`` is a function of (seed, salt, i) alone, so one input
    is reproduced without the others (``draw_one``)."""
    return [draw_one(gen, seed, salt, i) for i in range(n)]


def draw_one(gen: Gen[T], seed: int, salt: str, index: int) -> T:
    return gen(random.Random(f"{salt}:{seed}:{index}"))
