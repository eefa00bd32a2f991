"""OTLP export from a real router process to a real OTLP/gRPC collector on port 0."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from llmgw.common.telemetry import setup_tracing
from tests.support.procs import free_port, start, tool, wait_port

from .engines import FakeEngine

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[tuple[str, str, dict]] = []
        self.arrived = asyncio.Event()

    async def Export(self, request, context):  # noqa: N802
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append((span.name, span.trace_id.hex(), resource))
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()


async def test_router_exports_request_and_attempt_spans_over_otlp_when_configured(tmp_path):
    collector = Collector()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    otlp_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port = free_port()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    argv = [tool("llmgw-router"), "--listen", f"127.0.0.1:{port}"]
    try:
        async with FakeEngine() as engine:
            proc = await asyncio.to_thread(
                start, "router", [*argv, "--backend", f"m={engine.url}"], tmp_path, env
            )
            try:
                await asyncio.to_thread(wait_port, port, 30.0, proc)
                async with (
                    aiohttp.ClientSession() as client,
                    client.post(
                        f"http://127.0.0.1:{port}/v1/chat/completions",
                        json={"model": "m"},
                        headers={"traceparent": TRACEPARENT},
                    ) as resp,
                ):
                    assert resp.status == 200
                while {"POST /v1/chat/completions", "attempt"} - {
                    n for n, t, _ in collector.spans if t == TRACE_ID
                }:
                    collector.arrived.clear()
                    await asyncio.wait_for(collector.arrived.wait(), 20)
            finally:
                await asyncio.to_thread(proc.stop)
    finally:
        await server.stop(0)
    assert all(resource["service.name"] == "llmgw-router" for _, _, resource in collector.spans)
    assert engine.seen[-1].headers["traceparent"].split("-")[1] == TRACE_ID


def test_tracing_installs_nothing_without_an_otlp_endpoint(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert setup_tracing("router", "r1") is None
