"""A thread's runs, chunk by chunk → the ``UIMessage``s ``@tanstack/ai-client`` built live. Pure.

The TanStack hydration answer (``GET /api/chat?threadId``) must show what the live
``ChatClient`` showed: the same message boundaries, the same merged reasoning, the same
parts in the same order. A saved AG-UI transcript cannot say that: it groups a subagent's
tool calls under their parent message and keeps each reasoning block apart, and it does not
keep the order in which tool results arrived among the calls. So the answer is folded from
the run's chunks with the rules of ``StreamProcessor`` of ``@tanstack/ai`` 0.58
(``activities/chat/stream/processor.ts`` and ``message-updaters.ts``), which the client runs
on every chunk, for the chunk types baton's runs carry:

- ``TEXT_MESSAGE_START`` with a new ``messageId`` opens a message; if the run's first
  content came before it (reasoning, a tool call), the message that content opened is
  renamed to this id instead (the client's "pending manual message").
- Tool calls, reasoning, a run error and content without a known message join the *active*
  assistant message (the last one of this run), whatever their ``parentMessageId``.
- A ``STEP_STARTED`` names the thinking step, and every reasoning delta of the step goes to
  one ``thinking`` part (``stepId``), so reasoning blocks of one step are merged.
- Text after a tool call starts a new ``text`` part (a new segment); text after a thinking
  part starts a new part holding the whole segment so far (the client's own behaviour).
- ``TOOL_CALL_RESULT`` sets the call's ``output`` and ``state: complete`` and appends a
  ``tool-result`` part to the message holding the call.
- At the run's end every call not yet ``input-complete`` becomes so, and a last assistant
  message holding only blank text is removed (unless the run failed).

An assistant message the client would name with a random id (``msg-<ms>-<random>``: the
run's first content was reasoning and no text message followed, or a run error with no
message) gets a stable one here, ``<runId>:<n>``. Each run starts with fresh stream state,
as ``ChatClient`` does per request (``prepareAssistantMessage``). ``tests/gateway/
test_hydration_live.py`` checks the fold against the client itself for every corpus journal.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from baton.runs import RUN_ACCEPTED
from gateway._ui_messages import to_ui_messages

Chunk = dict[str, Any]
UIMessage = dict[str, Any]


def _strict_json(raw: str) -> tuple[bool, Any]:
    """``JSON.parse``: ``(ok, value)``; JavaScript has no NaN/Infinity literals."""
    def refuse(token: str) -> Any:
        raise ValueError(token)
    try:
        return True, json.loads(raw, parse_constant=refuse)
    except (ValueError, TypeError, RecursionError):
        return False, None


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass
class _Call:
    id: str
    name: str
    arguments: str = ""
    state: str = "awaiting-input"
    metadata: dict[str, Any] | None = None


@dataclass
class _MessageState:
    id: str
    role: str
    segment: str = ""
    emitted: str = ""
    steps: dict[str, str] = field(default_factory=dict)
    signatures: dict[str, str] = field(default_factory=dict)
    step: str | None = None
    calls: dict[str, _Call] = field(default_factory=dict)
    tools_since_text: bool = False


class UIStreamFolder:
    """Folds runs' chunks into UI messages as ``StreamProcessor`` does (module docstring).

    Args:
        messages: the UI messages already shown (earlier turns, the new user message).

    Deterministic: the same messages and chunks always give the same result.
    """

    def __init__(self, messages: Iterable[UIMessage] = ()) -> None:
        self.messages: list[UIMessage] = [copy.deepcopy(m) for m in messages]
        self._run_id = ""
        self._made = 0
        self._reset()

    def _reset(self) -> None:
        self._states: dict[str, _MessageState] = {}
        self._active: dict[str, None] = {}  # insertion-ordered set
        self._runs: set[str] = set()
        self._call_msg: dict[str, str] = {}
        self._pending_manual: str | None = None
        self._pending_step: str | None = None
        self._finish_reason: Any = None
        self._error = False

    # --- a run ---------------------------------------------------------------------------------
    def add_messages(self, messages: Iterable[UIMessage]) -> None:
        """Append messages the client added itself (a turn's user message)."""
        self.messages.extend(copy.deepcopy(m) for m in messages)

    def fold_run(self, run_id: str, chunks: Iterable[Chunk]) -> None:
        """One request's stream: fresh stream state, every chunk, then the end of the stream."""
        self._reset()
        self._run_id = run_id
        self._made = 0
        for c in chunks:
            self.feed(c)
        self.finalize()

    def feed(self, chunk: Chunk) -> None:
        """Apply one chunk (unknown types are ignored, as by the client)."""
        handler = _HANDLERS.get(str(chunk.get("type")))
        if handler is not None:
            handler(self, chunk)

    # --- lookups -------------------------------------------------------------------------------
    def _msg(self, mid: str) -> UIMessage | None:
        return next((m for m in self.messages if m.get("id") == mid), None)

    def _active_assistant(self) -> str | None:
        for mid in reversed(list(self._active)):
            st = self._states.get(mid)
            if st is not None and st.role == "assistant":
                return mid
        for mid, st in reversed(list(self._states.items())):
            if st.role == "assistant":
                return mid
        return None

    def _new_state(self, mid: str, role: str) -> _MessageState:
        st = _MessageState(mid, role)
        self._states[mid] = st
        return st

    def _ensure(self, preferred: str | None = None) -> tuple[str, _MessageState]:
        """``ensureAssistantMessage``: the message content without a known home joins."""
        if preferred and preferred in self._states:
            self._active[preferred] = None
            return preferred, self._states[preferred]
        active = self._active_assistant()
        if active is not None and active in self._states:
            self._active[active] = None
            return active, self._states[active]
        if preferred:
            existing = self._msg(preferred)
            if existing is not None:
                st = self._new_state(preferred, str(existing.get("role")))
                self._active[preferred] = None
                last = existing["parts"][-1] if existing.get("parts") else None
                if last is not None and last.get("type") == "text":
                    st.segment = st.emitted = str(last.get("content", ""))
                return preferred, st
        mid = preferred or self._stable_id()
        self.messages.append({"id": mid, "role": "assistant", "parts": []})
        st = self._new_state(mid, "assistant")
        self._active[mid] = None
        self._pending_manual = mid
        return mid, st

    def _stable_id(self) -> str:
        self._made += 1
        return f"{self._run_id}:{self._made}"

    # --- part updates (message-updaters.ts) ------------------------------------------------------
    def _each(self, mid: str) -> list[list[dict[str, Any]]]:
        """The parts of every message with this id: the client's updaters map over all of
        them (ids repeat when a thread's runs replay the same journal)."""
        return [m.setdefault("parts", []) for m in self.messages if m.get("id") == mid]

    def _emit_text(self, mid: str) -> None:
        st = self._states.get(mid)
        if st is None:
            return
        st.emitted = st.segment
        for parts in self._each(mid):
            if parts and parts[-1].get("type") == "text":
                parts[-1] = {"type": "text", "content": st.segment}
            else:
                parts.append({"type": "text", "content": st.segment})

    def _update_call(self, mid: str, call: _Call, input_: Any = None, has_input: bool = False) -> None:
        for parts in self._each(mid):
            self._update_call_in(parts, call, input_, has_input)

    @staticmethod
    def _update_call_in(parts: list[dict[str, Any]], call: _Call, input_: Any, has_input: bool) -> None:
        existing = next((p for p in parts if p.get("type") == "tool-call" and p.get("id") == call.id), None)
        metadata = call.metadata if call.metadata is not None else (existing or {}).get("metadata")
        part: dict[str, Any] = {"type": "tool-call", "id": call.id, "name": call.name,
                                "arguments": call.arguments, "state": call.state}
        if existing is not None and existing.get("approval"):
            part["approval"] = dict(existing["approval"])
        if existing is not None and "output" in existing:
            part["output"] = existing["output"]
        if has_input and input_ is not None:
            part["input"] = input_
        elif existing is not None and "input" in existing:
            part["input"] = existing["input"]
        if metadata is not None:
            part["metadata"] = metadata
        if existing is not None:
            parts[parts.index(existing)] = part
        else:
            parts.append(part)

    def _update_thinking(self, mid: str, step: str, content: str, signature: str | None) -> None:
        part: dict[str, Any] = {"type": "thinking", "content": content, "stepId": step}
        if signature:
            part["signature"] = signature
        for parts in self._each(mid):
            at = next((i for i, p in enumerate(parts) if p.get("type") == "thinking" and p.get("stepId") == step), None)
            if at is None:
                parts.append(dict(part))
            else:
                parts[at] = dict(part)

    def _call_part_state(self, call_id: str) -> str | None:
        for m in self.messages:
            for p in m.get("parts") or ():
                if p.get("type") == "tool-call" and p.get("id") == call_id:
                    return str(p.get("state"))
        return None

    def _complete_call(self, mid: str, call: _Call) -> None:
        call.state = "input-complete"
        ok, parsed = _strict_json(call.arguments)
        shown = self._call_part_state(call.id)
        if shown == "error" or shown == "approval-requested":
            return
        self._update_call(mid, call, parsed, has_input=ok)

    def _complete_calls(self, mid: str) -> None:
        st = self._states.get(mid)
        if st is None:
            return
        for call in st.calls.values():
            if call.state != "input-complete":
                self._complete_call(mid, call)

    # --- the stream's end -----------------------------------------------------------------------
    def finalize(self) -> None:
        """``finalizeStream``: complete calls, flush text, drop a blank last assistant message."""
        last: UIMessage | None = None
        for mid in list(self._active):
            st = self._states.get(mid)
            if st is None:
                continue
            self._complete_calls(mid)
            if st.segment != st.emitted:
                self._emit_text(mid)
            m = self._msg(mid)
            if m is not None and m.get("role") == "assistant":
                last = m
        self._active.clear()
        if last is not None and not self._error:
            parts = last.get("parts") or []
            if parts and all(p.get("type") == "text" and not str(p.get("content", "")).strip() for p in parts):
                self.messages = [m for m in self.messages if m.get("id") != last.get("id")]


def _continue_text(f: UIStreamFolder, mid: str, role: str) -> bool:
    """A text message that starts again on a message the folder holds: a new state when it
    has none (``True``), else, after tool calls, the text so far is emitted and a new text
    segment begins (``False``)."""
    st = f._states.get(mid)
    if st is None:
        f._new_state(mid, role)
        return True
    if st.tools_since_text:
        if st.segment != st.emitted:
            f._emit_text(mid)
        st.segment = st.emitted = ""
        st.tools_since_text = False
    return False


def _text_start(f: UIStreamFolder, c: Chunk) -> None:
    mid = c.get("messageId")
    if not isinstance(mid, str):
        return
    role = c.get("role") if c.get("role") in ("user", "system") else "assistant"
    if f._pending_manual is not None:
        pending, f._pending_manual = f._pending_manual, None
        if pending != mid:
            for m in f.messages:
                if m.get("id") == pending:
                    m["id"] = mid
            st = f._states.pop(pending, None)
            if st is not None:
                st.id = mid
                f._states[mid] = st
            f._active.pop(pending, None)
            f._active[mid] = None
            for call_id, owner in f._call_msg.items():
                if owner == pending:
                    f._call_msg[call_id] = mid
        if _continue_text(f, mid, str(role)):
            f._active[mid] = None
        return
    if f._msg(mid) is not None:
        f._active[mid] = None
        _continue_text(f, mid, str(role))
        return
    f.messages.append({"id": mid, "role": role, "parts": []})
    f._new_state(mid, str(role))
    f._active[mid] = None


def _text_content(f: UIStreamFolder, c: Chunk) -> None:
    mid, st = f._ensure(c.get("messageId") if isinstance(c.get("messageId"), str) else None)
    if st.tools_since_text and st.segment:
        if st.segment != st.emitted:
            f._emit_text(mid)
        st.segment = st.emitted = ""
    st.tools_since_text = False
    delta = _s(c.get("delta"))
    st.segment += delta
    if st.segment != st.emitted:  # the client's default strategy emits on every chunk
        f._emit_text(mid)


def _text_end(f: UIStreamFolder, c: Chunk) -> None:
    st = f._states.get(str(c.get("messageId")))
    if st is not None and st.segment != st.emitted:
        f._emit_text(st.id)


def _tool_start(f: UIStreamFolder, c: Chunk) -> None:
    target = c.get("parentMessageId") if isinstance(c.get("parentMessageId"), str) else f._active_assistant()
    mid, st = f._ensure(target or None)
    st.tools_since_text = True
    call_id = c.get("toolCallId")
    if not isinstance(call_id, str) or call_id in st.calls:
        return
    meta = c.get("metadata") if isinstance(c.get("metadata"), dict) else None
    call = _Call(call_id, str(c.get("toolCallName", "")), metadata=copy.deepcopy(meta))
    st.calls[call_id] = call
    f._call_msg[call_id] = mid
    f._update_call(mid, call)


def _tool_args(f: UIStreamFolder, c: Chunk) -> None:
    mid = f._call_msg.get(str(c.get("toolCallId")))
    st = f._states.get(mid) if mid else None
    call = st.calls.get(str(c.get("toolCallId"))) if st else None
    if mid is None or call is None:
        return
    delta = _s(c.get("delta"))
    if call.state == "awaiting-input" and delta:
        call.state = "input-streaming"
    call.arguments += delta
    # The part is rewritten without `metadata` from the call (the client passes none here).
    meta, call.metadata = call.metadata, None
    f._update_call(mid, call)
    call.metadata = meta


def _tool_end(f: UIStreamFolder, c: Chunk) -> None:
    mid = f._call_msg.get(str(c.get("toolCallId")))
    st = f._states.get(mid) if mid else None
    call = st.calls.get(str(c.get("toolCallId"))) if st else None
    if mid is None or call is None or call.state == "input-complete":
        return
    meta = _obj(c.get("metadata"))
    tanstack = _obj(meta.get("tanstack"))
    has_input = "input" in c or "input" in tanstack
    input_ = c["input"] if "input" in c else tanstack.get("input")
    if has_input and not call.arguments:
        try:
            call.arguments = json.dumps(input_, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    f._complete_call(mid, call)
    if has_input:
        f._update_call(mid, call, input_, has_input=True)


def _tool_result(f: UIStreamFolder, c: Chunk) -> None:
    call_id = c.get("toolCallId")
    if not isinstance(call_id, str):
        return
    mid = f._call_msg.get(call_id)
    if mid is None:
        mid = next((str(m["id"]) for m in f.messages if any(
            p.get("type") == "tool-call" and p.get("id") == call_id for p in m.get("parts") or ())), None)
    if mid is None:
        return
    meta = _obj(c.get("metadata"))
    tanstack = _obj(meta.get("tanstack"))
    failed = c.get("state") == "output-error" or tanstack.get("state") == "output-error"
    content = c.get("content", "")
    ok, output = _strict_json(content) if isinstance(content, str) else (False, None)
    if not ok:
        output = content
    for m in f.messages:
        for i, p in enumerate(m.get("parts") or ()):
            if p.get("type") == "tool-call" and p.get("id") == call_id:
                m["parts"][i] = {**p, "output": output, "state": "error" if failed else "complete"}
                break
    result: dict[str, Any] = {"type": "tool-result", "toolCallId": call_id, "content": content,
                              "state": "error" if failed else "complete"}
    if failed:
        err = output.get("error") if isinstance(output, dict) else None
        result["error"] = err if isinstance(err, str) else output if isinstance(output, str) else "Tool execution failed"
        if not result["error"]:
            del result["error"]
    for parts in f._each(mid):
        at = next((i for i, p in enumerate(parts) if p.get("type") == "tool-result" and p.get("toolCallId") == call_id),
                  None)
        if at is None:
            parts.append(dict(result))
        else:
            parts[at] = dict(result)


def _run_started(f: UIStreamFolder, c: Chunk) -> None:
    f._runs.add(str(c.get("runId")))


def _run_finished(f: UIStreamFolder, c: Chunk) -> None:
    meta = _obj(c.get("metadata"))
    tanstack = _obj(meta.get("tanstack"))
    f._finish_reason = c["finishReason"] if "finishReason" in c else tanstack.get("finishReason")
    f._runs.discard(str(c.get("runId")))
    if not f._runs:
        for mid in list(f._active):
            f._complete_calls(mid)
        outcome = _obj(c.get("outcome"))
        if f._finish_reason == "tool_calls" and outcome.get("type") != "interrupt":
            return
        f.finalize()


def _run_error(f: UIStreamFolder, c: Chunk) -> None:
    f._error = True
    if c.get("runId"):
        f._runs.discard(str(c["runId"]))
    else:
        f._runs.clear()
    f._ensure()


def _step_started(f: UIStreamFolder, c: Chunk) -> None:
    step = c.get("stepName") or f._stable_id()
    active = f._active_assistant()
    st = f._states.get(active) if active else None
    if st is None:
        f._pending_step = str(step)
        return
    st.step = str(step)
    st.steps.setdefault(st.step, "")
    f._pending_step = None


def _step_finished(f: UIStreamFolder, c: Chunk) -> None:
    signature = c.get("signature")
    if not signature:
        return
    mid, st = f._ensure(f._active_assistant())
    step = st.step or c.get("stepId")
    if not step or step not in st.steps:
        return
    st.signatures[step] = str(signature)
    f._update_thinking(mid, step, st.steps[step], str(signature))


def _consume_pending_step(f: UIStreamFolder, st: _MessageState) -> None:
    if f._pending_step is None:
        return
    st.step = f._pending_step
    st.steps.setdefault(st.step, "")
    f._pending_step = None


def _reasoning_content(f: UIStreamFolder, c: Chunk) -> None:
    mid, st = f._ensure(f._active_assistant())
    _consume_pending_step(f, st)
    step = st.step or str(c.get("messageId"))
    if step not in st.steps:
        st.steps[step] = ""
        st.step = step
    st.steps[step] += _s(c.get("delta"))
    f._update_thinking(mid, step, st.steps[step], st.signatures.get(step))


def _reasoning_encrypted(f: UIStreamFolder, c: Chunk) -> None:
    value = c.get("encryptedValue")
    if not isinstance(value, str) or not value:
        return
    if c.get("subtype") == "tool-call":
        for m in f.messages:
            for i, p in enumerate(m.get("parts") or ()):
                if p.get("type") == "tool-call" and p.get("id") == c.get("entityId"):
                    meta = _obj(p.get("metadata"))
                    m["parts"][i] = {**p, "metadata": {**meta, "thoughtSignature": value}}
        for st_ in f._states.values():
            call = st_.calls.get(str(c.get("entityId")))
            if call is not None:
                call.metadata = {**(call.metadata or {}), "thoughtSignature": value}
        return
    mid, st = f._ensure(f._active_assistant())
    step = st.step or str(c.get("entityId"))
    st.signatures[step] = value
    st.steps.setdefault(step, "")
    f._update_thinking(mid, step, st.steps[step], value)


_HANDLERS = {
    "TEXT_MESSAGE_START": _text_start, "TEXT_MESSAGE_CONTENT": _text_content, "TEXT_MESSAGE_END": _text_end,
    "TOOL_CALL_START": _tool_start, "TOOL_CALL_ARGS": _tool_args, "TOOL_CALL_END": _tool_end,
    "TOOL_CALL_RESULT": _tool_result, "RUN_STARTED": _run_started, "RUN_FINISHED": _run_finished,
    "RUN_ERROR": _run_error, "STEP_STARTED": _step_started, "STEP_FINISHED": _step_finished,
    "REASONING_MESSAGE_CONTENT": _reasoning_content, "REASONING_ENCRYPTED_VALUE": _reasoning_encrypted,
}


# --- a thread ------------------------------------------------------------------------------------

def accepted_input(chunks: Sequence[Chunk]) -> list[dict[str, Any]] | None:
    """The run input's messages from the host's first chunk (``CUSTOM run.accepted``, after
    ``RUN_STARTED``), or ``None`` when the log does not start so (its start was removed)."""
    head = chunks[1:2] if chunks and chunks[0].get("type") == "RUN_STARTED" else chunks[:1]
    if not head or head[0].get("type") != "CUSTOM" or head[0].get("name") != RUN_ACCEPTED:
        return None
    value = _obj(head[0].get("value"))
    msgs = value.get("messages")
    return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []


def prompt_messages(inputs: Sequence[dict[str, Any]], *, first: bool) -> list[UIMessage]:
    """What the client showed of a run's input before its answer.

    The thread's first run shows its whole input (a fork's copied conversation, or the
    user's first message); a later run, only its trailing user messages (the turn's prompt:
    the rest of its input is the conversation shown already). A message in the client's own
    shape (``parts``) is kept as is; an AG-UI one is converted by :func:`to_ui_messages`.
    """
    picked = list(inputs)
    if not first:
        at = len(picked)
        while at > 0 and picked[at - 1].get("role") == "user":
            at -= 1
        picked = picked[at:]
    out: list[UIMessage] = []
    batch: list[dict[str, Any]] = []
    for m in picked:
        if isinstance(m.get("parts"), list):
            out += to_ui_messages(batch)
            batch = []
            out.append({"id": str(m.get("id", "")), "role": m.get("role"), "parts": copy.deepcopy(m["parts"])})
        else:
            batch.append(m)
    return out + to_ui_messages(batch)


def thread_messages(runs: Sequence[tuple[str, Sequence[Chunk]]],
                    active_input: Sequence[dict[str, Any]] | None = None) -> list[UIMessage] | None:
    """The UI messages of a thread's finished runs, oldest first, as the live client built them.

    Args:
        runs: ``(run id, its whole log's chunks)`` per finished run, oldest first.
        active_input: the input of the run still going, if one is: its prompt is shown (the
            client re-plays the run itself from its start).

    Returns:
        The messages, or ``None`` when a log does not start with the run's input (its
        start was removed): the caller then answers from the saved transcript.
    """
    folder = UIStreamFolder()
    for i, (run_id, chunks) in enumerate(runs):
        inputs = accepted_input(chunks)
        if inputs is None:
            return None
        folder.add_messages(prompt_messages(inputs, first=i == 0))
        folder.fold_run(run_id, chunks)
    if active_input is not None:
        folder.add_messages(prompt_messages(active_input, first=not runs))
    return folder.messages
