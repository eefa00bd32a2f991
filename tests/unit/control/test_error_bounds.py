"""Errors quote bounded excerpts of what the caller sent: a huge name comes back as the reason.

Over real gRPC (the control plane in one process, MemoryStore underneath):
a status message travels in a header under gRPC's 8 KiB limit, so a
message repeating a 10,000-character name used to reach the caller as
RESOURCE_EXHAUSTED instead of the reason.
"""

from __future__ import annotations

import grpc
import pytest

from llmgw.common.errors import MAX_MESSAGE_BYTES, InvalidArgument, bounded, excerpt
from llmgw.common.etcd import MemoryStore
from llmgw.control.controlplane import ControlPlane
from llmgw.v1 import admin_pb2, admin_pb2_grpc

from .helpers import until
from .test_controlplane import SECRET, config, running

HUGE = "m" * 10_000


def test_an_excerpt_is_whole_when_short_and_bounded_when_long():
    assert excerpt("demo") == "'demo'"
    long = excerpt(HUGE)
    assert long.startswith("'mmmm") and long.endswith("... (10000 characters)") and len(long) < 100


def test_every_error_message_is_bounded_in_bytes_even_when_not_ascii():
    message = str(InvalidArgument("é" * 5_000))
    assert len(message.encode()) <= MAX_MESSAGE_BYTES + 40 and message.endswith("more bytes cut)")
    assert bounded("short") == "short"


async def test_a_ten_thousand_character_name_is_refused_with_the_reason_not_resource_exhausted(tmp_path):
    plane = ControlPlane(config(tmp_path, "control-a"), MemoryStore(), SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        async with grpc.aio.insecure_channel(plane.address) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            calls = [
                (
                    admin.AddModel(
                        admin_pb2.PutModelRequest(document=f"name: {HUGE}\nprofile: {{engine: simulator}}")
                    ),
                    grpc.StatusCode.INVALID_ARGUMENT,
                ),
                (admin.RemoveModel(admin_pb2.RemoveModelRequest(name=HUGE)), grpc.StatusCode.NOT_FOUND),
                (admin.GetModel(admin_pb2.GetModelRequest(name=HUGE)), grpc.StatusCode.NOT_FOUND),
                (admin.ListReplicas(admin_pb2.ListReplicasRequest(model=HUGE)), grpc.StatusCode.NOT_FOUND),
            ]
            for call, code in calls:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == code, err.value.details()
                assert "(10000 characters)" in err.value.details()
                assert len(err.value.details().encode()) <= MAX_MESSAGE_BYTES
