"""A client's WebSocket on the front: the connection after a ``101 Switching Protocols``.

The WebSocket protocol is the ``websockets`` library's, sans I/O
(``ServerProtocol``): it checks the opening handshake (RFC 6455 §4.2),
parses and unmasks frames, answers pings and the closing handshake, and
refuses a message over ``max_size`` (close code 1009, including a message
split into fragments) or a frame that breaks the protocol (1002) or a text
message that is no UTF-8 (1007). The front hands it the connection's bytes
(:meth:`FrontSocket.feed`) and writes what it says to send; this module
assembles whole messages for :meth:`FrontSocket.receive` and frames those
given to :meth:`FrontSocket.send`. No extension (permessage-deflate) is
offered: a compressed message could inflate past the size its frames claim.

**Flow control**: messages received and not yet taken wait in a queue; past
``max_size`` bytes of them, the front stops reading the client's socket
until they are taken, so a client that sends faster than its engine reads
holds at most about two messages' worth of the router's memory. A send
waits while the client does not read (the connection's write deadline
closes it if that lasts: :mod:`.front`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

from .seam import SocketClosed


class SocketOwner(Protocol):
    """The front connection a socket lives on (:class:`.frontconn.FrontConnection`)."""

    @property
    def write_paused(self) -> bool: ...
    def writer(self) -> asyncio.Transport | None: ...  # None once the client is gone
    async def drained(self) -> None: ...


def handshake(head: bytes, max_size: int, extra: dict[str, str]) -> tuple[ServerProtocol, Response]:
    """The server's side of an opening handshake: the protocol, and the answer to send.

    ``head`` is the request's head as llhttp parsed it (its request line
    and fields, rejoined), given to the library whole so that its parser
    is past the head when the frames come. The answer is a 101 when the
    request is a valid WebSocket upgrade, else the library's 400 or 426
    saying what is wrong.
    """
    protocol = ServerProtocol(max_size=max_size)
    protocol.receive_data(head)
    events = protocol.events_received()
    if len(events) != 1 or not isinstance(events[0], Request):
        response = protocol.reject(400, "The request head is not a WebSocket opening handshake.\n")
    else:
        response = protocol.accept(events[0])
    if response.status_code == 101:
        for name, value in extra.items():
            response.headers[name] = value
    protocol.send_response(response)
    return protocol, response


class FrontSocket:
    """One client WebSocket, opened (see the module docstring); also the request's reply (101)."""

    status = 101
    prepared = True

    def __init__(self, conn: SocketOwner, protocol: ServerProtocol, headers: dict[str, str]) -> None:
        self._conn = conn
        self._protocol = protocol
        self.headers = headers
        self._max = protocol.max_message_size or 0
        self._messages: deque[str | bytes] = deque()
        self._queued = 0
        self._parts: list[bytes] = []
        self._text = False
        self._waiter: asyncio.Future[None] | None = None
        self._lost = False
        self.reading_paused = False
        self.flush()

    # The front's side: bytes in, bytes out.

    def feed(self, data: bytes) -> None:
        self._protocol.receive_data(data)
        self._take_events()

    def lost(self) -> None:
        """The client's connection is gone."""
        self._lost = True
        self._wake()

    def flush(self) -> None:
        """Write what the protocol has to send.

        The library's end of the closing handshake (an empty chunk: close the
        TCP connection) is left to the front, which closes the connection
        once the session's handler has returned.
        """
        transport = self._conn.writer()
        if transport is None:
            return
        data = b"".join(self._protocol.data_to_send())
        if data:
            transport.write(data)

    def _take_events(self) -> None:
        for event in self._protocol.events_received():
            if not isinstance(event, Frame):
                continue
            if event.opcode in (Opcode.TEXT, Opcode.BINARY):
                self._text = event.opcode is Opcode.TEXT
                self._parts = [bytes(event.data)]
            elif event.opcode is Opcode.CONT:
                self._parts.append(bytes(event.data))
            else:
                continue  # ping, pong, close: the protocol has answered them
            if event.fin:
                data = b"".join(self._parts)
                self._parts = []
                if self._text:
                    try:
                        message: str | bytes = data.decode("utf-8")
                    except UnicodeDecodeError:
                        self._protocol.fail(CloseCode.INVALID_DATA, "a text message is not UTF-8")
                        break
                else:
                    message = data
                self._messages.append(message)
                self._queued += len(data)
        self.flush()
        transport = self._conn.writer()
        if self._queued > self._max and transport is not None and not self.reading_paused:
            self.reading_paused = True
            transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # The handler's side (:class:`.seam.ClientSocket`).

    @property
    def open(self) -> bool:
        return self._protocol.state is State.OPEN and not self._lost

    async def receive(self) -> str | bytes:
        while not self._messages:
            if self._protocol.state is not State.OPEN or self._lost:
                raise self._closed()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message = self._messages.popleft()
        self._queued -= len(message)
        if self.reading_paused and self._queued <= self._max:
            transport = self._conn.writer()
            self.reading_paused = False
            if transport is not None:
                transport.resume_reading()
        return message

    async def send(self, message: str | bytes) -> None:
        if not self.open:
            raise ConnectionResetError("the client's WebSocket is closed")
        if isinstance(message, str):
            self._protocol.send_text(message.encode("utf-8"))
        else:
            self._protocol.send_binary(message)
        self.flush()
        if self._conn.write_paused:
            await self._conn.drained()

    async def close(self, code: int, reason: str) -> None:
        """Start the closing handshake (a no-op once closing); the front closes the connection after."""
        if self._protocol.state is State.OPEN and not self._lost:
            # A close frame's reason is at most 123 bytes.
            self._protocol.send_close(code, reason.encode()[:123].decode(errors="ignore"))
            self.flush()

    def _closed(self) -> SocketClosed:
        rcvd = self._protocol.close_rcvd
        if rcvd is not None:
            return SocketClosed(int(rcvd.code), rcvd.reason, by_peer=True)
        sent = self._protocol.close_sent
        if sent is not None:
            return SocketClosed(int(sent.code), sent.reason, by_peer=False)
        return SocketClosed(int(CloseCode.ABNORMAL_CLOSURE), "the connection was lost", by_peer=True)

    async def closed(self) -> None:
        """Wait for the closing handshake to end (the client's close frame); the caller bounds it."""
        protocol = self._protocol
        while protocol.state is not State.CLOSED and protocol.close_rcvd is None and not self._lost:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
