"""Chunk fingerprints (docs/design.md §5.4).

A fingerprint identifies what a chunk *says*, not when it was said: the SHA-256 (hex) of
the canonical JSON (sorted keys, ``(",", ":")`` separators, UTF-8, no ASCII escaping) of
the chunk's ``type`` plus the AG-UI spec fields of that type. ``timestamp``, ``rawEvent``
and ``metadata`` never count. A field present with ``null`` differs from an absent one.
The per-type field lists follow the AG-UI event definitions; every
type also counts ``subagentRunId`` when present, because ag-ui-protocol 1.0 puts it on
every event and a subagent's message must not match its parent's. Types not listed count
every field but the excluded ones.

Pure and deterministic: the same chunk gives the same fingerprint on any host.
"""
from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring as _encode_str
from typing import Any, Mapping

EXCLUDED: frozenset[str] = frozenset({"timestamp", "rawEvent", "metadata"})

_REASONING_ID = ("messageId",)

SPEC_FIELDS: dict[str, tuple[str, ...]] = {
    "RUN_STARTED": ("threadId", "runId", "parentRunId", "input"),
    "RUN_FINISHED": ("threadId", "runId", "result", "outcome", "usage"),
    "RUN_ERROR": ("message", "code"),
    "TEXT_MESSAGE_START": ("messageId", "role", "name"),
    "TEXT_MESSAGE_CONTENT": ("messageId", "delta"),
    "TEXT_MESSAGE_END": ("messageId",),
    "TOOL_CALL_START": ("toolCallId", "toolCallName", "parentMessageId"),
    "TOOL_CALL_ARGS": ("toolCallId", "delta"),
    "TOOL_CALL_END": ("toolCallId",),
    "TOOL_CALL_RESULT": ("messageId", "toolCallId", "content", "role"),
    "REASONING_START": _REASONING_ID,
    "REASONING_MESSAGE_START": ("messageId", "role"),
    "REASONING_MESSAGE_CONTENT": ("messageId", "delta"),
    "REASONING_MESSAGE_END": _REASONING_ID,
    "REASONING_MESSAGE_CHUNK": ("messageId", "delta"),
    "REASONING_END": _REASONING_ID,
    "CUSTOM": ("name", "value"),
    "RAW": ("event", "source"),
    "STEP_STARTED": ("stepName",),
    "STEP_FINISHED": ("stepName",),
    "STATE_SNAPSHOT": ("snapshot",),
    "STATE_DELTA": ("delta",),
    "MESSAGES_SNAPSHOT": ("messages",),
    "ACTIVITY_SNAPSHOT": ("messageId", "activityType", "content", "replace"),
    "ACTIVITY_DELTA": ("messageId", "activityType", "patch"),
    "SUBAGENT_STARTED": ("subagentRunId", "name"),
    "SUBAGENT_FINISHED": ("subagentRunId",),
    "SUBAGENT_ERROR": ("subagentRunId", "message"),
}

_ALWAYS = ("type", "subagentRunId")


def spec_view(chunk: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``chunk`` that its fingerprint covers (present fields only)."""
    fields = SPEC_FIELDS.get(str(chunk.get("type")))
    if fields is None:
        return {k: v for k, v in chunk.items() if k not in EXCLUDED}
    return {k: chunk[k] for k in (*_ALWAYS, *fields) if k in chunk}


# Built once: ``json.dumps`` with options builds a new encoder per call, and every append
# fingerprints its chunk. Same output as ``json.dumps(value, sort_keys=True, ...)``.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def canonical_json(value: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace, UTF-8 (no ``\\u`` escaping)."""
    return _CANONICAL(value).encode("utf-8")


#: Each listed type's counted fields in canonical (sorted) order, with each key's JSON.
_SORTED: dict[str, tuple[tuple[str, str], ...]] = {
    t: tuple((k, '"%s":' % k) for k in sorted({*_ALWAYS, *fields})) for t, fields in SPEC_FIELDS.items()
}


def fingerprint(chunk: Mapping[str, Any]) -> str:
    """The chunk's fingerprint: SHA-256 hex of the canonical JSON of :func:`spec_view`.

    Every append fingerprints its chunk, so a chunk whose counted fields are all strings
    (text and reasoning deltas, most chunks) has its canonical JSON joined from the field
    names in sorted order and each string as the JSON encoder itself writes it
    (``json.encoder.encode_basestring``): the same bytes, without building the spec view
    and sorting it (tests/log/test_fingerprint.py compares the two).

    Args:
        chunk: an AG-UI event as a camelCase JSON object (``type`` is the EventType value).

    Returns:
        64 lowercase hex characters.

    Raises:
        TypeError: when the chunk holds values JSON cannot encode.
    """
    keys = _SORTED.get(str(chunk.get("type")))
    if keys is not None:
        parts = []
        for k, key_json in keys:
            if k in chunk:
                v = chunk[k]
                if type(v) is not str:
                    break
                parts.append(key_json + _encode_str(v))
        else:
            return hashlib.sha256(("{" + ",".join(parts) + "}").encode("utf-8")).hexdigest()
    return hashlib.sha256(_CANONICAL(spec_view(chunk)).encode("utf-8")).hexdigest()


def slow_fingerprint(chunk: Mapping[str, Any]) -> str:
    """:func:`fingerprint` by its definition alone (tests compare the two)."""
    return hashlib.sha256(_CANONICAL(spec_view(chunk)).encode("utf-8")).hexdigest()
