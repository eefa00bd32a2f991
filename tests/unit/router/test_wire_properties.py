"""Property-based tests (hypothesis) of the two parsers' seams: the front's head and body reading,
and the upstream client's chunked decoding.

Both run the real protocol objects with in-memory transports: a request or
an answer is generated, cut at arbitrary points into reads, and must come out
the same however it was cut; arbitrary bytes must never raise out of
``data_received`` (a traceback from the network) and must get an HTTP
answer or nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.router.answer import Answer
from llmgw.router.config import Limits
from llmgw.router.front import Front
from llmgw.router.upstream_wire import BUSY, IDLE, Connection, UpstreamResponse, WireLimits

TOKEN = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~", min_size=1
)
# A field value: visible ASCII with inner blanks, no leading or trailing blank (they are not part of it).
VALUE = st.text(alphabet=[chr(c) for c in range(0x21, 0x7F)] + [" ", "\t"], max_size=40).map(
    lambda v: v.strip(" \t")
)
RESERVED = {"host", "content-length", "transfer-encoding", "connection", "expect", "upgrade", "te", "trailer"}
FIELDS = st.lists(
    st.tuples(TOKEN.filter(lambda n: n.lower() not in RESERVED), VALUE),
    max_size=12,
)
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class MemoryTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.write(part)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def serve(pieces: list[bytes]) -> tuple[list[tuple[str, str, list[tuple[str, str]], bytes]], bytes]:
    """Feed ``pieces`` to one front connection; what the handler saw, and what was written."""
    seen: list[tuple[str, str, list[tuple[str, str]], bytes]] = []

    async def handler(request: Any) -> Answer:
        seen.append((request.method, request.path, list(request.headers.items()), await request.read()))
        return Answer(200, {"Content-Type": "application/json"}, b"{}")

    async def run() -> bytes:
        front = Front(handler, lambda method, path: handler, Limits(max_body_bytes=4096))
        conn = front()
        transport = MemoryTransport()
        conn.connection_made(transport)
        for piece in pieces:
            conn.data_received(piece)
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)
        conn.connection_lost(None)
        return bytes(transport.written)

    return seen, asyncio.run(run())


@SETTINGS
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]),
    fields=FIELDS,
    body=st.binary(max_size=300),
    chunked=st.booleans(),
    points=st.lists(st.integers(min_value=0), max_size=8),
)
def test_a_request_cut_anywhere_reaches_the_handler_whole(path, fields, body, chunked, points):
    head = f"POST {path} HTTP/1.1\r\nHost: router:8080\r\n" + "".join(f"{n}: {v}\r\n" for n, v in fields)
    if chunked:
        framed = head.encode() + b"Transfer-Encoding: chunked\r\n\r\n"
        framed += b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, len(body), 7)
        )
        framed += b"0\r\n\r\n"
    else:
        framed = head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body
    seen, written = serve(cuts(framed, points))
    assert written.startswith(b"HTTP/1.1 200 OK\r\n")
    [(method, got_path, headers, got_body)] = seen
    assert (method, got_path, got_body) == ("POST", path, body)
    assert [
        h for h in headers if h[0].lower() not in ("host", "content-length", "transfer-encoding")
    ] == fields


@SETTINGS
@given(data=st.binary(max_size=400), points=st.lists(st.integers(min_value=0), max_size=6))
def test_arbitrary_bytes_never_raise_and_get_an_http_answer_or_none(data, points):
    _, written = serve(cuts(data, points))
    assert written == b"" or written.startswith(b"HTTP/1.1 ")


@SETTINGS
@given(
    prefix=st.sampled_from([b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"]),
    junk=st.binary(min_size=1, max_size=200),
)
def test_a_head_gone_wrong_midway_gets_an_openai_error(prefix, junk):
    _, written = serve([prefix + junk + b"\r\n\r\n"])
    if written and not written.startswith(b"HTTP/1.1 200 "):
        head, _, body = written.partition(b"\r\n\r\n")
        assert b"Content-Type: application/json" in head and body.startswith(b'{"error": ')


class Pool:
    def __init__(self) -> None:
        self.given_back = 0
        self.forgotten = 0

    def give_back(self, conn: Connection) -> None:
        self.given_back += 1
        conn.state = IDLE  # as the real pool does

    def forget(self, conn: Connection) -> None:
        self.forgotten += 1


def answer(pieces: list[bytes]) -> tuple[UpstreamResponse | BaseException, bytes | BaseException, Pool, bool]:
    """Feed an answer in ``pieces`` to one upstream connection: the head's outcome, the body's,
    the pool, and whether the connection was closed."""

    async def run() -> tuple[Any, Any, Pool, bool]:
        pool = Pool()
        conn = Connection(pool, ("http", "e", 80), WireLimits(max_answer_bytes=1 << 20))
        transport = MemoryTransport()
        conn.connection_made(transport)
        head = conn.send(b"POST / HTTP/1.1\r\n\r\n")
        for piece in pieces:
            if transport.closed:
                break
            conn.data_received(piece)
        if conn.state is BUSY:
            # The engine sent all it will: it closes the connection.
            transport.closed = True
            conn.connection_lost(None)
        try:
            response = await head
        except Exception as err:  # noqa: BLE001 - the outcome under test
            return err, err, pool, transport.closed
        try:
            body: Any = await asyncio.wait_for(response.read(), 1)
        except Exception as err:  # noqa: BLE001
            body = err
        return response, body, pool, transport.closed

    return asyncio.run(run())


CHUNKS = st.lists(
    st.tuples(st.binary(min_size=1, max_size=50), st.sampled_from([b"", b";a=b", b";x"])), max_size=10
)


@SETTINGS
@given(
    chunks=CHUNKS,
    trailers=st.sampled_from([b"", b"X-T: 1\r\n"]),
    upper=st.booleans(),
    points=st.lists(st.integers(min_value=0), max_size=10),
)
def test_a_chunked_answer_cut_anywhere_is_unframed_whole_and_given_back_once(chunks, trailers, upper, points):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    sizes = [(b"%X" if upper else b"%x") % len(c) for c, _ in chunks]
    wire = head + b"".join(s + e + b"\r\n" + c + b"\r\n" for s, (c, e) in zip(sizes, chunks, strict=True))
    wire += b"0\r\n" + trailers + b"\r\n"
    response, body, pool, closed = answer(cuts(wire, points))
    assert body == b"".join(c for c, _ in chunks)
    assert (pool.given_back, closed) == (1, False)


@SETTINGS
@given(
    chunks=CHUNKS,
    garbage=st.binary(min_size=1, max_size=20),
    at=st.integers(min_value=0),
    points=st.lists(st.integers(min_value=0), max_size=6),
)
def test_a_corrupted_chunked_answer_fails_or_is_whole_and_is_never_given_back_with_bytes_after(
    chunks, garbage, at, points
):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(c), e, c) for c, e in chunks) + b"0\r\n\r\n"
    at %= len(body) + 1
    wire = head + body[:at] + garbage + body[at:]
    response, got, pool, closed = answer(cuts(wire, points))
    # Never an exception out of data_received (answer() would have raised); given back at most
    # once, and only with a whole body; closed unless given back (a byte after the end, arriving
    # once it was idle, closes it then).
    assert pool.given_back in (0, 1)
    assert pool.given_back or closed
    if pool.given_back:
        assert isinstance(got, bytes)
