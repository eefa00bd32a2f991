"""The agents' fabric test over real loopback TCP: the token, the bounds, the figures."""

from __future__ import annotations

import asyncio
import struct

import pytest

from llmgw.agent.fabric import (
    HELLO,
    MAGIC,
    MAX_BAD_CONNECTIONS,
    MAX_LISTENERS,
    FabricTests,
    nccl_status,
    probe,
)
from llmgw.common.errors import InvalidArgument, Unavailable

TOKEN = bytes(range(32))


async def test_a_probe_with_the_token_measures_bandwidth_and_latency():
    tests = FabricTests("127.0.0.1")
    try:
        port = await tests.listen(TOKEN, 8 << 20, 10, 10)
        m = await probe("127.0.0.1", port, TOKEN, 8 << 20, 10, 10)
    finally:
        await tests.aclose()
    assert m.bytes == 8 << 20 and m.pings == 10
    assert m.bandwidth_bytes_per_second > 1e6
    assert 0 < m.latency_seconds < 1


async def test_a_listener_serves_one_test_then_closes():
    tests = FabricTests("127.0.0.1")
    try:
        port = await tests.listen(TOKEN, 1 << 20, 2, 10)
        await probe("127.0.0.1", port, TOKEN, 1 << 20, 2, 10)
        with pytest.raises(Unavailable):
            await probe("127.0.0.1", port, TOKEN, 1 << 20, 2, 5)
    finally:
        await tests.aclose()


async def test_a_wrong_token_is_refused_and_the_right_one_still_works():
    tests = FabricTests("127.0.0.1")
    try:
        port = await tests.listen(TOKEN, 1 << 20, 2, 10)
        with pytest.raises(Unavailable, match="closed the fabric test early"):
            await probe("127.0.0.1", port, bytes(32), 1 << 20, 2, 5)
        m = await probe("127.0.0.1", port, TOKEN, 1 << 20, 2, 10)
        assert m.bytes == 1 << 20
    finally:
        await tests.aclose()


async def test_a_probe_announcing_more_than_the_bound_is_refused():
    tests = FabricTests("127.0.0.1")
    try:
        port = await tests.listen(TOKEN, 1 << 20, 2, 10)
        with pytest.raises(Unavailable):
            await probe("127.0.0.1", port, TOKEN, 2 << 20, 2, 5)
        with pytest.raises(Unavailable):
            await probe("127.0.0.1", port, TOKEN, 1 << 20, 3, 5)
    finally:
        await tests.aclose()


async def test_the_listener_closes_after_too_many_bad_connections():
    tests = FabricTests("127.0.0.1")
    try:
        port = await tests.listen(TOKEN, 1 << 20, 2, 10)
        for _ in range(MAX_BAD_CONNECTIONS):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(HELLO.pack(MAGIC, bytes(32), 1, 1))
            assert await reader.read() == b""
            writer.close()
        await asyncio.wait_for(_closed(port), 5)
    finally:
        await tests.aclose()


async def _closed(port: int) -> None:
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        writer.close()
        await asyncio.sleep(0.01)


async def test_a_silent_peer_is_cut_off_at_the_listeners_time_limit():
    tests = FabricTests("127.0.0.1")
    try:
        port = await tests.listen(TOKEN, 1 << 20, 2, 0.3)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(struct.pack(">4s", MAGIC))  # and then nothing
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        await tests.aclose()


async def test_bounds_are_checked_before_anything_listens():
    tests = FabricTests("127.0.0.1")
    with pytest.raises(InvalidArgument):
        await tests.listen(TOKEN, 0, 1, 10)
    with pytest.raises(InvalidArgument):
        await tests.listen(TOKEN, 1, 1001, 10)
    with pytest.raises(InvalidArgument):
        await tests.listen(b"short", 1, 1, 10)
    with pytest.raises(InvalidArgument):
        await probe("127.0.0.1", 1, TOKEN, 1, 1, 0)
    try:
        for _ in range(MAX_LISTENERS):
            await tests.listen(TOKEN, 1, 1, 10)
        with pytest.raises(Unavailable, match="already listens"):
            await tests.listen(TOKEN, 1, 1, 10)
    finally:
        await tests.aclose()


def test_nccl_is_said_not_to_run_without_nvml_gpus_or_without_the_tool():
    assert "no NVIDIA GPUs" in nccl_status(0, lambda _: "/usr/bin/all_reduce_perf")
    assert "not on the PATH" in nccl_status(8, lambda _: None)
    said = nccl_status(8, lambda _: "/opt/nccl-tests/all_reduce_perf")
    assert "/opt/nccl-tests/all_reduce_perf" in said and "MPI" in said
