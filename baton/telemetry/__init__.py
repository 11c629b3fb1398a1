"""Observability of the services: structured logs and OpenTelemetry traces (docs/operating.md).

* :func:`configure_logging`: one JSON object per line (``BATON_LOG_FORMAT=json``) or text, for
  every logger of the process, uvicorn's included; :func:`log_fields` / :func:`bind_fields`
  add a run's ``run_id``, ``thread_id``, ``epoch`` and ``host`` to the lines logged while it
  is handled.
* :func:`configure_tracing`: an OTLP exporter when the ``OTEL_*`` variables name an endpoint;
  :func:`run_span`, :func:`activate` and :class:`TracingInterceptor` make one trace per run.
"""
from baton.telemetry._logs import (FIELDS, FORMATS, JsonFormatter, TextFormatter, announce, bind_fields,
                                   configure_logging, current_fields, log_fields)
from baton.telemetry._tracing import (TracingInterceptor, activate, configure_tracing, current_traceparent, in_span,
                                      parent_of, remote_parent, run_span, server_interceptors, span_traceparent, tracer,
                                      tracing_enabled)

__all__ = ["FIELDS", "FORMATS", "JsonFormatter", "TextFormatter", "TracingInterceptor", "activate", "announce",
           "bind_fields", "configure_logging", "configure_tracing", "current_fields", "current_traceparent",
           "in_span", "log_fields", "parent_of", "remote_parent", "run_span", "server_interceptors", "span_traceparent",
           "tracer", "tracing_enabled"]
