"""baton.telemetry's pure parts: the JSON line, the run fields, traceparent round trips."""
from __future__ import annotations

import io
import json
import logging

import pytest

from baton import telemetry
from baton.telemetry import JsonFormatter, TextFormatter, log_fields


def _record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("baton.test", logging.WARNING, __file__, 1, msg, None, info)


def test_a_json_line_carries_the_bound_run_fields_and_the_traceback_as_one_field() -> None:
    fmt = JsonFormatter("sandbox_host", {"host": "h1"})
    try:
        raise ValueError("boom")
    except ValueError as exc:
        err = exc
    with log_fields(run_id="r1", thread_id="t1", epoch=2, host=None):
        line = fmt.format(_record("run r1: it failed", err))
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["level"] == "WARNING" and obj["logger"] == "baton.test" and obj["msg"] == "run r1: it failed"
    assert obj["service"] == "sandbox_host" and obj["host"] == "h1"
    assert (obj["run_id"], obj["thread_id"], obj["epoch"]) == ("r1", "t1", 2)
    assert "ValueError: boom" in obj["exc"] and "trace_id" not in obj
    # Outside the block the fields are gone.
    assert "run_id" not in json.loads(fmt.format(_record("idle")))


def test_the_text_line_appends_the_fields_before_any_traceback() -> None:
    with log_fields(run_id="r1"):
        line = TextFormatter().format(_record("hello"))
    assert line.endswith("baton.test: hello [run_id=r1]")


def test_configure_logging_refuses_an_unknown_format_and_routes_uvicorn() -> None:
    with pytest.raises(ValueError, match="BATON_LOG_FORMAT"):
        telemetry.configure_logging("gateway", fmt="xml")
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    try:
        telemetry.configure_logging("gateway", level="INFO", fmt="json", stream=out)
        logging.getLogger("uvicorn.error").info("Started server process")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)
    assert json.loads(out.getvalue().splitlines()[-1])["logger"] == "uvicorn.error"


def test_traceparent_round_trip_and_garbage() -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ctx = telemetry.parent_of(tp)
    assert ctx is not None and telemetry.span_traceparent(ctx) == tp
    assert telemetry.parent_of("") is None and telemetry.parent_of("00-zz-yy-01") is None


def test_tracing_is_off_unless_an_endpoint_is_set() -> None:
    assert not telemetry.tracing_enabled({})
    assert telemetry.tracing_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"})
    assert telemetry.tracing_enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"})
    assert not telemetry.tracing_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"})
    assert not telemetry.tracing_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"})
    assert telemetry.server_interceptors({}) == []
