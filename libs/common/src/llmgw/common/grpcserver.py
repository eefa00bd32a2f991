"""A gRPC asyncio server that always serves health and reflection.

Every llmgw gRPC server is built here so each one answers
``grpc.health.v1.Health`` and server reflection, and ``grpcurl -plaintext
HOST:PORT list`` works with no proto files. Shutdown is graceful: health
flips to NOT_SERVING first (load balancers stop sending), then in-flight
calls get ``grace`` seconds before they are cancelled.

With ``tls`` (common/tls.py) the port is mutual TLS, with the certificate
re-read when its files change; without it, or with ``tls.plaintext``, it
is plaintext (``grpcurl -plaintext``; with TLS, grpcurl takes ``-cacert
-cert -key -authority llmgw-control``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .tls import TlsSettings, server_credentials

# A registration function as grpc generates them: add_FooServicer_to_server.
Registration = tuple[Callable[[object, grpc.aio.Server], None], object, str]

# Messages are small here (tables, commands); a generous bound still refuses
# a runaway peer.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class GrpcServer:
    def __init__(
        self,
        address: str,
        services: Sequence[Registration],
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        tls: TlsSettings | None = None,
        *,
        credentials: grpc.ServerCredentials | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        maximum_concurrent_rpcs: int | None = None,
        options: Sequence[tuple[str, object]] = (),
    ):
        """``credentials``, when given, replace what ``tls`` would make (the join port's server-only TLS)."""
        # Kept for an in-process caller that must see what gRPC clients see
        # (the control plane's HTTP port: same handlers, same interceptors).
        self.registrations = list(services)
        self.interceptors = list(interceptors)
        self._server = grpc.aio.server(
            interceptors=list(interceptors),
            maximum_concurrent_rpcs=maximum_concurrent_rpcs,
            options=[
                *options,
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ],
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        names = [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name]
        self._names: list[str] = []
        for register, servicer, full_name in services:
            register(servicer, self._server)
            self._names.append(full_name)
        names.extend(self._names)
        names.append(reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self._server)
        if credentials is not None:
            self.port = self._server.add_secure_port(address, credentials)
        elif tls is not None and not tls.plaintext:
            self.port = self._server.add_secure_port(address, server_credentials(tls))
        else:
            self.port = self._server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")

    async def start(self) -> None:
        await self._server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        for name in self._names:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 5.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self._server.stop(grace)

    async def wait(self) -> None:
        await self._server.wait_for_termination()
