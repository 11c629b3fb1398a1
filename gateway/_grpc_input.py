"""The gRPC edge's input: ``baton.v1.Runs`` request messages → the run service's requests.

The proto is read here and nowhere else; it becomes the domain requests of
:mod:`gateway._service` directly (never the HTTP edge's JSON), whose shared checks run there.
"""
from __future__ import annotations

from typing import Any

from baton import errors as e, strict_json
from baton.ids import validate_id
from baton.keep import check_keep_ttl
from baton.v1 import runs_pb2, runs_service_pb2 as pb
from gateway._errors import BodyTooLarge
from gateway._service._keep import KeepRequest
from gateway._paging import check_limit
from gateway._service import (MAX_JSON_DEPTH, CancelRequest, JoinRequest, ListRunsRequest, StartLimits, StartRequest,
                              cancel_request, check_offset, json_depth, start_request)

DEFAULT_PAGE = 100
MAX_PAGE = 1000


def _messages(raw: str) -> Any:
    if not raw:
        return None
    try:
        value = strict_json.loads(raw)
    except ValueError:
        raise e.InvalidArgument("messages_json", "must be a JSON array") from None
    except RecursionError:
        raise e.InvalidArgument("messages_json", f"must not nest deeper than {MAX_JSON_DEPTH} levels") from None
    if isinstance(value, (list, dict)) and json_depth(value) > MAX_JSON_DEPTH:
        raise e.InvalidArgument("messages_json", f"must not nest deeper than {MAX_JSON_DEPTH} levels")
    return value


def _agent(spec: runs_pb2.AgentSpec) -> Any:
    if not spec.kind and not spec.options_json:
        return None
    options: Any = {}
    if spec.options_json:
        try:
            options = strict_json.loads(spec.options_json)
        except (ValueError, RecursionError):
            raise e.InvalidArgument("agent.options_json", "must be a JSON object") from None
        if not isinstance(options, dict):
            raise e.InvalidArgument("agent.options_json", "must be a JSON object")
    return {**options, "kind": spec.kind}


def start_request_of(request: pb.RunStartRequest, limits: StartLimits, max_bytes: int) -> StartRequest:
    """``RunStartRequest`` → the service's start request. A new start field is read here.

    Raises:
        BodyTooLarge: the message is larger than ``max_bytes`` (as an HTTP body would be).
        DurableRunIdRequired: no run id. InvalidArgument: any other bad input, by field.
    """
    if request.ByteSize() > max_bytes:
        raise BodyTooLarge(max_bytes)
    messages = _messages(request.messages_json)
    agent = _agent(request.agent)
    if not request.run_id:
        raise e.DurableRunIdRequired()
    return start_request(
        run_id=request.run_id,
        thread_id=request.thread_id,
        messages=messages,
        agent=agent,
        limits=limits,
        cancel_on_disconnect=request.cancel_on_disconnect,
        interrupt_active=request.interrupt_active,
        parent_run_id=request.parent_run_id,
        workspace=_workspace(request.workspace) if request.HasField("workspace") else None,
        multitask=request.multitask,
    )


def _workspace(ws: pb.Workspace) -> dict[str, Any]:
    """A ``Workspace`` message as the workspace object (unset fields left out)."""
    out: dict[str, Any] = {k: v for k, v in (("git", ws.git), ("ref", ws.ref), ("credential", ws.credential),
                                              ("dir", ws.dir)) if v}
    if ws.setup:
        out["setup"] = list(ws.setup)
    return out


def join_request_of(request: pb.RunJoinRequest) -> JoinRequest:
    """``RunJoinRequest`` → a join: after an offset, only what is new, or from the start.

    As over HTTP (where a join without ``offset`` is a 400), the position is required: a
    client that forgot it is told so rather than sent the whole log.

    Raises:
        InvalidArgument: a bad run id; no position, or ``from_start``/``only_new`` false
            (field ``position``); a negative or non-finite ``keep_ttl_seconds``; a
            ``snapshot_messages`` out of range.
            InvalidOffset: a malformed ``after_offset``.
    """
    run_id = validate_id(request.run_id, "runId")
    position = request.WhichOneof("position")
    if position == "after_offset":
        after = check_offset(request.after_offset)
    elif position == "only_new" and request.only_new:
        after = "now"
    elif position == "from_start" and request.from_start:
        after = "-1"
    elif position == "from_snapshot" and request.from_snapshot:
        after = "snapshot"
    else:
        raise e.InvalidArgument("position", "is required: from_start=true reads from the start, only_new=true "
                                            "only what comes next, from_snapshot=true the latest snapshot then the rest, "
                                            "after_offset the rest after a chunk you hold")
    keep_ttl = check_keep_ttl(request.keep_ttl_seconds, "keep_ttl_seconds", allow_zero=True)
    messages = check_limit(request.snapshot_messages, "snapshot_messages") if after == "snapshot" else 0
    return JoinRequest(run_id, after, keep_ttl=keep_ttl, messages=messages)


def keep_request_of(request: pb.RunKeepRequest) -> KeepRequest:
    """``RunKeepRequest`` → a keep-alive.

    Raises:
        InvalidArgument: a bad run id, or ``ttl_seconds`` not a finite number > 0.
    """
    return KeepRequest(validate_id(request.run_id, "runId"), check_keep_ttl(request.ttl_seconds, "ttl_seconds"))


def cancel_request_of(request: pb.RunCancelRequest, default_timeout: float) -> CancelRequest:
    target = request.WhichOneof("target")
    return cancel_request(request.run_id if target == "run_id" else None,
                          request.thread_id if target == "thread_id" else None,
                          wait=request.wait, timeout=request.timeout_seconds or None, default_timeout=default_timeout)


def list_runs_request_of(request: pb.RunListRequest) -> ListRunsRequest:
    if request.page_size < 0 or request.page_size > MAX_PAGE:
        raise e.InvalidArgument("page_size", f"must be in [0, {MAX_PAGE}]")
    thread_id = validate_id(request.thread_id, "threadId") if request.thread_id else None
    return ListRunsRequest(thread_id, request.page_size or DEFAULT_PAGE, request.page_token)
