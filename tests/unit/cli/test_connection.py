"""The CLI names the part that failed: its own connection, or what the control plane reports."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from llmgw.cli.connection import AdminError, Target
from tests.support.procs import free_port

ETCD_DOWN = "etcd range failed on every member: 127.0.0.1:2379: failed to connect to all addresses"


@pytest.fixture
def answering_unavailable():
    """A real gRPC server whose one method answers UNAVAILABLE quoting etcd's connection error."""

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.UNAVAILABLE, ETCD_DOWN)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "test.Admin", {"Do": grpc.unary_unary_rpc_method_handler(handler)}
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def _call(address: str) -> AdminError:
    target = Target(address)
    with grpc.insecure_channel(address) as ch:
        method = ch.unary_unary("/test.Admin/Do")
        with pytest.raises(AdminError) as err:
            target.call("model add", method, b"", timeout=5)
    return err.value


def test_an_unavailable_the_control_plane_sends_is_shown_as_its_own(answering_unavailable):
    message = str(_call(answering_unavailable))
    assert "not reachable" not in message
    assert message == f"model add failed: UNAVAILABLE: {ETCD_DOWN}"


def test_an_address_nothing_listens_on_is_not_reachable():
    address = f"127.0.0.1:{free_port()}"
    message = str(_call(address))
    assert message.startswith(f"control plane at {address} is not reachable")
