"""Logging and tracing set-up. Called by entry points only, never by libraries.

Logs are one line per record, key=value, so they read in a terminal and
parse with a regex. Tracing installs an OpenTelemetry tracer provider named
for the role, exporting over OTLP/gRPC, only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set; otherwise nothing is installed and
no span is recorded anywhere.
"""

from __future__ import annotations

import logging
import os
import sys

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = (
            f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} {record.levelname.lower()} "
            f"{record.name}: {record.getMessage()}"
        )
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


def setup_logging(role: str, level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger(role).debug("logging ready")


def setup_tracing(role: str, instance: str) -> TracerProvider | None:
    """Install an exporting tracer provider when OTLP is configured; return it, or None.

    Configured means ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its traces-only
    variant) is set; the exporter then reads the standard ``OTEL_EXPORTER_OTLP_*``
    variables itself (headers, timeout, certificates). Without it nothing is
    installed and the OpenTelemetry API stays a no-op, so a caller can skip
    span work altogether when this returns None. The caller shuts the
    provider down on exit, which flushes the spans still batched.
    """
    log = logging.getLogger(role)
    # The traces-only variable wins, as it does in the exporter.
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp-proto-grpc is not "
            "installed; traces are not exported"
        )
        return None
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"llmgw-{role}", "service.instance.id": instance})
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("exporting traces over OTLP to %s", endpoint)
    return provider
