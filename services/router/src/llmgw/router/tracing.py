"""OpenTelemetry traces: a span per proxied request, a child span per attempt.

Decisions:

- **Off means absent.** The app gets a :class:`Tracing` only when the entry
  point installed an exporting tracer provider (``OTEL_EXPORTER_OTLP_ENDPOINT``
  set, see :func:`llmgw.common.telemetry.setup_tracing`); without one the
  proxy holds ``None`` and creates no span at all, not even a no-op one, and
  the client's ``traceparent`` / ``tracestate`` go to the engine untouched,
  so a trace still joins up across the router.
- **W3C trace context, explicitly.** The request span continues the client's
  ``traceparent`` (a malformed one starts a new trace, as the W3C spec
  says); each attempt's span is its child, and the engine receives the
  *attempt's* context, so an engine that traces hangs its spans under the
  attempt that reached it. The propagator is the W3C one, held here, not
  the process-global one, so nothing else can change what goes upstream.
- **One attempt, one span.** Retries, resumes and fallbacks each show as a
  sibling attempt span under the request, with the replica and the reason
  it failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .table import Route

_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(frozen=True)
class AttemptSpan:
    span: trace.Span

    def failed(self, reason: str) -> None:
        self.span.set_status(Status(StatusCode.ERROR, reason))


@dataclass(frozen=True)
class RequestSpan:
    span: trace.Span

    def finish(self, *, status: int, model: str, replica: str) -> None:
        self.span.set_attribute("http.response.status_code", status)
        self.span.set_attribute("llmgw.model", model)
        if replica:
            self.span.set_attribute("llmgw.replica", replica)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))


class Tracing:
    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    @contextlib.contextmanager
    def request(
        self, method: str, path: str, headers: Mapping[str, str], request_id: str
    ) -> Iterator[RequestSpan]:
        parent = _PROPAGATOR.extract(headers)
        with self._tracer.start_as_current_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path, "llmgw.request_id": request_id},
        ) as span:
            yield RequestSpan(span)

    @contextlib.contextmanager
    def attempt(self, route: Route) -> Iterator[AttemptSpan]:
        with self._tracer.start_as_current_span(
            "attempt",
            kind=SpanKind.CLIENT,
            attributes={
                "llmgw.replica": route.endpoint.id,
                "llmgw.model": route.endpoint.model,
                "server.address": route.endpoint.url,
            },
        ) as span:
            yield AttemptSpan(span)

    def inject(self, headers: dict[str, str]) -> None:
        """Replace the trace context in ``headers`` with the current span's."""
        headers.pop("traceparent", None)
        headers.pop("tracestate", None)
        _PROPAGATOR.inject(headers)
