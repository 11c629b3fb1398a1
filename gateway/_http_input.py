"""The HTTP edge's input: request bodies, headers and query strings → the run service's requests.

JSON is read here and nowhere else (bounded, depth-checked), and turned into the domain
requests of :mod:`gateway._service` (whose shared checks run there, once for every edge).
"""
from __future__ import annotations

import pathlib
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from starlette.requests import Request

from baton import errors as e, strict_json
from baton.agents import invalid_argument
from baton.ids import validate_id
from gateway._errors import BodyTooLarge
from gateway._service import (MAX_JSON_DEPTH, CancelRequest, StartLimits, StartRequest, cancel_request, json_depth,
                              start_request)

__all__ = ["cancel_request_of", "check_chat_start", "read_json_object", "run_id_from"]


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """Read the request body as a JSON object, refusing more than ``max_bytes`` bytes.

    The limit is enforced while reading (a lying or absent ``Content-Length`` does not help).

    Raises:
        BodyTooLarge: the body is larger than ``max_bytes``.
        InvalidArgument: the body is not a JSON object, or nests deeper than
            ``MAX_JSON_DEPTH`` levels.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(max_bytes)
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > max_bytes:
            raise BodyTooLarge(max_bytes)
    if not buf.strip():
        return {}
    try:
        value = strict_json.loads(buf)
    except strict_json.NonFiniteNumber as exc:
        raise e.InvalidArgument("body", f"must be JSON: {exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise e.InvalidArgument("body", "must be a JSON object") from None
    except RecursionError:
        # The decoder recurses per nesting level: a body within the size limit can exhaust it.
        raise e.InvalidArgument("body", f"must not nest deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise e.InvalidArgument("body", "must be a JSON object")
    if json_depth(value) > MAX_JSON_DEPTH:
        raise e.InvalidArgument("body", f"must not nest deeper than {MAX_JSON_DEPTH} levels")
    return value


def only_fields(body: Mapping[str, Any], *allowed: str) -> None:
    """Refuse a field the request does not take (a misspelt ``updated_input`` would be
    dropped silently and the unedited command approved).

    Raises:
        InvalidArgument: the first unknown field (sorted), naming the fields taken.
    """
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        # The client's own text: a lone surrogate in it is escaped, never logged or sent raw.
        name = unknown[0][:100].encode("utf-8", "backslashreplace").decode("utf-8")
        raise e.InvalidArgument(name, f"is not a field of this request (it takes {', '.join(allowed)})")


def _opt_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise e.InvalidArgument(name, "must be a string")
    return value


def run_id_from(headers: Mapping[str, str], query: Mapping[str, str], body: Mapping[str, Any]) -> str:
    """The run id: ``X-Run-Id`` header, else ``?runId``, else the body's ``runId`` (docs/design.md §6).

    Raises:
        DurableRunIdRequired: none of the three carries one.
        InvalidArgument: the id breaks the id rules of :mod:`baton.ids`.
    """
    for source, value in (
        ("X-Run-Id", headers.get("x-run-id")),
        ("runId", query.get("runId")),
        ("runId", _opt_str(body, "runId")),
    ):
        if value:
            return validate_id(value, source)
    raise e.DurableRunIdRequired()


class _ChatBody(BaseModel):
    """The fields of a ``POST /api/chat`` body the gateway reads, by their AG-UI names.

    Not ``ag_ui.core.RunAgentInput`` itself: that requires ``runId`` in the body (we also
    take it from ``X-Run-Id`` or ``?runId``), ``messages`` and ``threadId``, and validates
    each message against its role's full schema (``id`` required), which would refuse the
    message shapes TanStack clients send and the host passes through untouched. Any other
    field (``state``, ``tools``, ``context``, ...) is allowed. ``messages`` are checked by
    the service's :func:`~gateway._service.start_request`.
    """

    model_config = ConfigDict(extra="allow", strict=True, alias_generator=to_camel)
    run_id: str | None = None
    thread_id: str | None = None
    parent_run_id: str | None = None
    forwarded_props: dict[str, Any] | None = None


class _ChatOptions(BaseModel):
    """Our options, at the top level or under ``forwardedProps`` (merged before this)."""

    model_config = ConfigDict(extra="ignore", strict=True, alias_generator=to_camel)
    agent: dict[str, Any] | None = None
    detach_on_disconnect: bool = Field(True, description="false: the client leaving cancels the run")
    interrupt_active: bool = False
    multitask: str | None = None


def _validated(model: type[BaseModel], value: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise invalid_argument(exc) from None


def check_chat_start(
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    query: Mapping[str, str],
    *,
    replay_dirs: Sequence[pathlib.Path],
    default_agent: str,
    max_messages: int,
    workspace_dirs: Sequence[str] = (),
) -> StartRequest:
    """A ``POST /api/chat`` (AG-UI run input plus our options) as the service's start request.

    Our options may sit at the top level or, as the TanStack client sends its ``body``
    option, under ``forwardedProps``; the top level wins. A new start field is read here
    (and passed to :func:`~gateway._service.start_request`).

    Raises:
        DurableRunIdRequired: no run id anywhere.
        InvalidArgument: any other bad input, naming the field (``messages[3].role``).
    """
    parsed: _ChatBody = _validated(_ChatBody, body)
    run_id = run_id_from(headers, query, body)
    thread_id = parsed.thread_id or query.get("threadId")
    props = parsed.forwarded_props or {}
    merged = {name: body[name] if body.get(name) is not None else props.get(name)
              for name in ("agent", "detachOnDisconnect", "interruptActive", "workspace", "multitask")}
    workspace = merged.pop("workspace")
    opts: _ChatOptions = _validated(_ChatOptions, {k: v for k, v in merged.items() if v is not None})
    return start_request(
        run_id=run_id,
        thread_id=thread_id,
        messages=body.get("messages"),
        agent=opts.agent,
        limits=StartLimits(replay_dirs, default_agent, max_messages, workspace_dirs),
        cancel_on_disconnect=not opts.detach_on_disconnect,
        interrupt_active=opts.interrupt_active,
        parent_run_id=parsed.parent_run_id or "",
        workspace=workspace,
        multitask=opts.multitask,
    )


def cancel_request_of(body: Mapping[str, Any], query: Mapping[str, str], default_timeout: float) -> CancelRequest:
    """``POST /api/chat/cancel``'s ``{runId | threadId}`` (body or query), ``?wait``, ``?timeout``.

    Raises:
        InvalidArgument: ids that are not strings or break the id rules; a bad timeout.
    """
    run_id = body.get("runId") or query.get("runId")
    thread_id = body.get("threadId") or query.get("threadId")
    if run_id is not None and not isinstance(run_id, str) or thread_id is not None and not isinstance(thread_id, str):
        raise e.InvalidArgument("runId", "runId and threadId must be strings")
    wait = query.get("wait", "false").lower() in ("1", "true", "yes")
    raw_timeout = None
    if "timeout" in query:
        try:
            raw_timeout = float(query["timeout"])
        except ValueError:
            raise e.InvalidArgument("timeout", "must be a number of seconds") from None
    return cancel_request(run_id, thread_id, wait=wait, timeout=raw_timeout, default_timeout=default_timeout)
