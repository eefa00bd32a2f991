"""Logging and tracing set-up. Called by entry points only, never by libraries.

Logs are one line per record, key=value, so they read in a terminal and
parse with a regex. Tracing installs an OpenTelemetry tracer provider named
for the role; spans are exported over OTLP only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and the exporter is installed, and
nowhere otherwise.
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


def setup_tracing(role: str, instance: str) -> None:
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"llmgw-{role}", "service.instance.id": instance})
    )
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            logging.getLogger(role).warning(
                "OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp is not "
                "installed; traces are not exported"
            )
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
