"""Service logs: one JSON object per line (or text), with the run's fields when known.

Every service calls :func:`configure_logging` once in its composition root. It installs one
handler on the root logger; uvicorn's loggers (``uvicorn``, ``uvicorn.error``) are left
unconfigured by the gateway (``log_config=None``) so they propagate to it, and every line
of a process has the same format.

The run's fields (``run_id``, ``thread_id``, ``epoch``, ``host``) come from a context
variable that the code handling a run sets with :func:`log_fields` (asyncio tasks copy it,
so whatever a run's task spawns logs them too); ``trace_id``/``span_id`` come from the
OpenTelemetry span current at the call, when the service traces.
"""
from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any, Iterator, Mapping, TextIO

from opentelemetry import trace

__all__ = ["FIELDS", "FORMATS", "JsonFormatter", "TextFormatter", "announce", "bind_fields", "configure_logging",
           "current_fields", "log_fields"]

#: The run fields a line may carry, in the order they are written.
FIELDS = ("run_id", "thread_id", "epoch", "host")
FORMATS = ("json", "text")

_fields: ContextVar[Mapping[str, Any]] = ContextVar("baton_log_fields", default={})


def current_fields() -> Mapping[str, Any]:
    """The run fields bound in this context (empty outside a run)."""
    return _fields.get()


def bind_fields(**fields: Any) -> None:
    """Add run fields to this context for good (e.g. at the top of a run's own task).

    ``None`` values are ignored. Prefer :func:`log_fields` where a scope ends.
    """
    given = {k: v for k, v in fields.items() if v is not None and v != ""}
    if given:
        _fields.set({**_fields.get(), **given})


@contextlib.contextmanager
def log_fields(**fields: Any) -> Iterator[None]:
    """Within the block, log lines carry ``fields`` (``run_id=..., epoch=...``) as well.

    ``None`` or empty values are left out. Restores the previous fields on exit.
    """
    token = _fields.set({**_fields.get(), **{k: v for k, v in fields.items() if v is not None and v != ""}})
    try:
        yield
    finally:
        _fields.reset(token)


def _trace_ids() -> tuple[str, str] | None:
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``,
    ``service``, the static fields, the run fields bound in the caller's context,
    ``trace_id``/``span_id`` when a span is current, and ``exc`` (the formatted traceback)
    when the record carries one.

    Args:
        service: the process's service name (``gateway``, ``coordinator``, ``sandbox_host``).
        static: fields every line carries (a sandbox host's ``host``).
    """

    def __init__(self, service: str, static: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._service = service
        self._static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "service": self._service,
            **self._static,
        }
        out.update(_fields.get())
        ids = _trace_ids()
        if ids is not None:
            out["trace_id"], out["span_id"] = ids
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The plain format (``time LEVEL logger: message``), the run fields appended as
    ``key=value`` when bound."""

    def __init__(self, static: Mapping[str, Any] | None = None) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {**self._static, **_fields.get()}
        ids = _trace_ids()
        if ids is not None:
            fields["trace_id"] = ids[0]
        if not fields:
            return line
        head, nl, rest = line.partition("\n")  # after the message, before any traceback
        return f"{head} [{' '.join(f'{k}={v}' for k, v in fields.items())}]{nl}{rest}"


def configure_logging(service: str, *, level: str | None = None, fmt: str | None = None,
                      static: Mapping[str, Any] | None = None, stream: TextIO | None = None) -> None:
    """Route every logger of the process (uvicorn's included) to one handler on ``stream``.

    Args:
        service: the service name written on each JSON line.
        level: the root level; default ``BATON_LOG_LEVEL``.
        fmt: ``json`` or ``text``; default ``BATON_LOG_FORMAT``.
        static: fields every line carries (a sandbox host passes ``host``).
        stream: default ``sys.stderr``.

    Raises:
        ValueError: ``fmt`` (or ``BATON_LOG_FORMAT``) is neither ``json`` nor ``text``.
    """
    from baton import config

    fmt = (fmt or config.get("BATON_LOG_FORMAT")).strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"BATON_LOG_FORMAT must be json or text, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(service, static) if fmt == "json" else TextFormatter(static))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel((level or config.get("BATON_LOG_LEVEL")).upper())
    # uvicorn's own handlers (when something configured them) would print a second format.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
        lg.disabled = False  # a dictConfig before (disable_existing_loggers) silenced it
        lg.setLevel(logging.NOTSET)  # the root's level, unless uvicorn's own config sets one after
    logging.captureWarnings(True)


def announce(logger: str, message: str) -> None:
    """Print ``message`` to stdout and flush: a service's "listening on <port>" line, which
    launchers and people wait for. Formatted as a JSON log line when the process logs JSON
    (every line of its output is then one object), as the bare message otherwise."""
    formatter = next((h.formatter for h in logging.getLogger().handlers if isinstance(h.formatter, JsonFormatter)),
                     None)
    if formatter is None:
        print(message, flush=True)
        return
    record = logging.LogRecord(logger, logging.INFO, __file__, 0, message, None, None)
    print(formatter.format(record), flush=True)
