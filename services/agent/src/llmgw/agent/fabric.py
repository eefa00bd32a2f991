"""Fabric tests: bandwidth and latency between this node and another, over TCP.

The leader asks node A to listen (:meth:`FabricTests.listen`) and node B to
connect and measure (:func:`probe`). Decisions:

- **Authenticated by a one-time token**, not by the node certificates: the
  leader makes 32 random bytes per test and sends them to both agents over
  their mutually authenticated streams. A accepts only a connection that
  presents them (compared in constant time) and serves one test, then
  closes its listener; a connection with a wrong token is dropped, and
  after :data:`MAX_BAD_CONNECTIONS` of them the listener closes. The bytes
  measured are zeros, so what crosses the wire in clear is the token of a
  test that is over once it is used, and nothing else.
- **Bounded**: A refuses a test that announces more than the leader's
  ``max_bytes`` or ``max_pings``; the listener, each connection and the
  probe all end at their ``timeout_seconds``; at most
  :data:`MAX_LISTENERS` listeners at once.
- **What it measures**: latency is the median of ``pings`` 8-byte round
  trips; bandwidth is the bytes B sent divided by the seconds from its
  first byte to A's acknowledgement of the last, so buffers on the way do
  not flatter it.
- **NCCL**: where GPUs are present and NCCL's tests (``all_reduce_perf``)
  are on the PATH, the node says so; a cross-node NCCL run needs an MPI
  launch across both hosts that llmgw does not have, so TCP is what is
  measured, and the result says why NCCL was not run (:func:`nccl_status`).

Wire protocol (all integers big-endian): B sends ``LGF1``, the 32-byte
token, the byte count (u64) and the ping count (u32); A answers ``OK``.
Then ``pings`` times B sends 8 bytes and A echoes them; then B sends the
byte count's bytes and A answers the count it received (u64).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import shutil
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.common.errors import InvalidArgument, Unavailable

log = logging.getLogger("llmgw.agent.fabric")

MAGIC = b"LGF1"
TOKEN_BYTES = 32
HELLO = struct.Struct(f">4s{TOKEN_BYTES}sQI")
COUNT = struct.Struct(">Q")
PING_BYTES = 8
CHUNK = 1 << 20
MAX_LISTENERS = 4
MAX_BAD_CONNECTIONS = 8
# Hard ceilings whatever the leader asks: 4 GiB, 1000 pings, 10 minutes.
MAX_BYTES = 4 << 30
MAX_PINGS = 1000
MAX_TIMEOUT_SECONDS = 600.0
NCCL_TOOL = "all_reduce_perf"


@dataclass(frozen=True)
class Measurement:
    bandwidth_bytes_per_second: float
    latency_seconds: float
    bytes: int
    pings: int


def nccl_status(nvml_gpus: int, which: Callable[[str], str | None] = shutil.which) -> str:
    """Whether NCCL's tests could run here, in words for the operator.

    ``nvml_gpus``: the GPUs NVML reports (0 where the GPUs are declared).
    """
    if nvml_gpus == 0:
        return "not run: no NVIDIA GPUs on this node (NVML finds no driver); measured TCP"
    gpu_count = nvml_gpus
    tool = which(NCCL_TOOL)
    if tool is None:
        return f"not run: NCCL's tests ({NCCL_TOOL}) are not on the PATH; measured TCP"
    return (
        f"not run: {NCCL_TOOL} is at {tool} with {gpu_count} GPU(s), but a run across nodes needs an "
        "MPI launch on both hosts, which llmgw does not make; measured TCP"
    )


def _check(bytes_: int, pings: int, timeout: float) -> None:
    if not 0 < bytes_ <= MAX_BYTES:
        raise InvalidArgument(f"a fabric test sends 1 to {MAX_BYTES} bytes, not {bytes_}")
    if not 0 < pings <= MAX_PINGS:
        raise InvalidArgument(f"a fabric test makes 1 to {MAX_PINGS} pings, not {pings}")
    if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise InvalidArgument(f"a fabric test's timeout is 0 to {MAX_TIMEOUT_SECONDS:g}s, not {timeout:g}")


class FabricTests:
    """The listeners this agent holds for fabric tests; closing it ends them."""

    def __init__(self, bind_host: str):
        self._bind_host = bind_host
        self._tasks: set[asyncio.Task] = set()

    async def listen(self, token: bytes, max_bytes: int, max_pings: int, seconds: float) -> int:
        """Listen for one test; the port. The listener closes after it, or after ``seconds``."""
        _check(max_bytes, max_pings, seconds)
        if len(token) != TOKEN_BYTES:
            raise InvalidArgument(f"a fabric test token is {TOKEN_BYTES} bytes, not {len(token)}")
        if len(self._tasks) >= MAX_LISTENERS:
            raise Unavailable(
                f"this node already listens for {MAX_LISTENERS} fabric tests; try again when they end"
            )
        served = asyncio.Event()
        bad = [0]
        open_writers: set[asyncio.StreamWriter] = set()

        async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peername")
            open_writers.add(writer)
            try:
                async with asyncio.timeout(seconds):
                    if await _serve(reader, writer, token, max_bytes, max_pings):
                        served.set()
                    else:
                        bad[0] += 1
                        log.warning("fabric test: refused a connection from %s (wrong token or bounds)", peer)
                        if bad[0] >= MAX_BAD_CONNECTIONS:
                            served.set()
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as err:
                log.warning("fabric test with %s ended early: %s", peer, type(err).__name__)
            finally:
                open_writers.discard(writer)
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

        server = await asyncio.start_server(session, self._bind_host, 0)
        port = server.sockets[0].getsockname()[1]

        async def hold() -> None:
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(seconds):
                        await served.wait()
            finally:
                server.close()
                # Ends the sessions still open (a probe cut off by the timeout).
                for w in list(open_writers):
                    w.close()
                await server.wait_closed()

        task = asyncio.create_task(hold(), name=f"fabric-listen-{port}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return port

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: bytes, max_bytes: int, max_pings: int
) -> bool:
    """One test, A's side; False when the hello is refused."""
    magic, presented, count, pings = HELLO.unpack(await reader.readexactly(HELLO.size))
    if magic != MAGIC or not hmac.compare_digest(presented, token):
        return False
    if count > max_bytes or pings > max_pings:
        return False
    writer.write(b"OK")
    await writer.drain()
    for _ in range(pings):
        writer.write(await reader.readexactly(PING_BYTES))
        await writer.drain()
    received = 0
    while received < count:
        chunk = await reader.read(min(CHUNK, count - received))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", count - received)
        received += len(chunk)
    writer.write(COUNT.pack(received))
    await writer.drain()
    return True


async def probe(
    host: str,
    port: int,
    token: bytes,
    bytes_: int,
    pings: int,
    seconds: float,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """B's side: connect to A's listener and measure, within ``seconds``."""
    _check(bytes_, pings, seconds)
    if not 0 < port < 65536:
        raise InvalidArgument(f"port {port} is not a TCP port")
    try:
        async with asyncio.timeout(seconds):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                return await _measure(reader, writer, token, bytes_, pings, clock)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:
        raise Unavailable(f"the fabric test with {host}:{port} took longer than {seconds:g}s") from None
    except asyncio.IncompleteReadError:
        raise Unavailable(
            f"{host}:{port} closed the fabric test early (it refused the token or the sizes)"
        ) from None
    except OSError as err:
        raise Unavailable(f"cannot reach {host}:{port} for a fabric test: {err}") from None


async def _measure(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    token: bytes,
    bytes_: int,
    pings: int,
    clock: Callable[[], float],
) -> Measurement:
    writer.write(HELLO.pack(MAGIC, token, bytes_, pings))
    await writer.drain()
    if await reader.readexactly(2) != b"OK":
        raise asyncio.IncompleteReadError(b"", 2)
    trips = []
    for i in range(pings):
        sent = struct.pack(">Q", i)
        start = clock()
        writer.write(sent)
        await writer.drain()
        if await reader.readexactly(PING_BYTES) != sent:
            raise Unavailable("the fabric test's echo did not match what was sent")
        trips.append(clock() - start)
    zeros = bytes(CHUNK)
    view = memoryview(zeros)
    start = clock()
    left = bytes_
    while left > 0:
        n = min(CHUNK, left)
        writer.write(view[:n])
        await writer.drain()
        left -= n
    (received,) = COUNT.unpack(await reader.readexactly(COUNT.size))
    elapsed = max(clock() - start, 1e-9)
    if received != bytes_:
        raise Unavailable(f"the other node received {received} of {bytes_} bytes")
    return Measurement(bytes_ / elapsed, statistics.median(trips), bytes_, pings)
