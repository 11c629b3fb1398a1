"""The gateway's run service: one layer under every edge (HTTP, gRPC, Durable Streams).

Each edge parses its format into a request here (frozen dataclasses), calls
:class:`RunService`, and renders the answer in its format; neither edge goes through the
other's format. Reads are :class:`gateway._reader.RunRead` objects (the shared tail,
presence, the takeover trigger), which each edge frames its own way.
"""
from gateway._service._cancel import CancelOutcome
from gateway._service._requests import (AGENT_KINDS, MAX_CANCEL_WAIT, MAX_JSON_DEPTH, REPLAY_FORMATS, AgentChoice,
                                        CancelRequest, JoinRequest, ListRunsRequest, StartLimits, StartRequest,
                                        agent_list, cancel_request, check_agent, check_cancel_timeout, check_offset,
                                        json_depth, list_replay_journals, start_request)
from gateway._service._inputs import (ApprovalAnswer, SteerRequest, approval_answer, awaiting_approval, input_json,
                                      steer_request)
from gateway._service._runs import RunService
from gateway._service._threads import ForkRequest, Forked, fork_request
from gateway._service._views import JOIN_RECORD_WAIT, join_view_for

__all__ = ["AGENT_KINDS", "ApprovalAnswer", "SteerRequest", "approval_answer", "awaiting_approval", "input_json",
           "steer_request", "JOIN_RECORD_WAIT", "MAX_CANCEL_WAIT", "MAX_JSON_DEPTH", "REPLAY_FORMATS", "AgentChoice",
           "CancelOutcome", "CancelRequest", "ForkRequest", "Forked", "JoinRequest", "ListRunsRequest", "RunService", "StartLimits",
           "StartRequest", "agent_list", "cancel_request", "check_agent", "check_cancel_timeout", "check_offset",
           "fork_request", "join_view_for", "json_depth", "list_replay_journals", "start_request"]
