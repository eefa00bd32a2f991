"""The seam between the router's servers and its handler chain: what a request is, how it is answered.

Two servers run the same chain (:mod:`.envelope`'s middleware, :mod:`.auth`'s,
then :meth:`.proxy.Proxy.handle`): the router's own front (:mod:`.front`) on
the listening port, and aiohttp (the app as a whole: the workers' metrics
socket, tests that run ``build_app`` on aiohttp's server). The chain reads a
request through :class:`RequestView` / :class:`ProxyRequest` and answers
through the request's :class:`Responder`, so it never asks which server it
runs on; each server brings its own implementation (the front's
:class:`.frontwire.FrontRequest`, :class:`AiohttpRequest` here).

A responder makes either answer the proxy gives: a whole one
(:meth:`Responder.whole`, written by the server in one piece) or a stream
(:meth:`Responder.stream`, status 200, its head sent with the first chunk).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Protocol, TypeVar, overload

from aiohttp import WSMsgType, web

from .errors import HttpRefusal

T = TypeVar("T")


class Reply(Protocol):
    """What a handler returns: an answer the server writes, or a stream already under way."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> MutableMapping[str, str]: ...
    @property
    def prepared(self) -> bool: ...


class StreamReply(Reply, Protocol):
    """A streamed answer (``ConnectionResetError`` from a write once the client is gone)."""

    async def write(self, data: bytes) -> None: ...
    async def write_eof(self, data: bytes = b"") -> None: ...


class SocketClosed(Exception):
    """A client's WebSocket is closed: the close code and reason, and whether the client closed it."""

    def __init__(self, code: int, reason: str, *, by_peer: bool) -> None:
        super().__init__(f"closed with code {code}: {reason}")
        self.code = code
        self.reason = reason
        self.by_peer = by_peer


class ClientSocket(Reply, Protocol):
    """A client's WebSocket, opened (its reply is the 101 already sent).

    ``receive`` raises :class:`SocketClosed` once the client closed it, the
    connection was lost, or the protocol closed it (a message over the size
    limit: code 1009); ``send`` raises ``ConnectionResetError`` once it is
    closed. ``closed`` waits for the closing handshake to end (the caller bounds it).
    """

    async def receive(self) -> str | bytes: ...
    async def send(self, message: str | bytes) -> None: ...
    async def close(self, code: int, reason: str) -> None: ...
    async def closed(self) -> None: ...


class Responder(Protocol):
    """How a request is answered on the server that has it."""

    def whole(self, status: int, headers: dict[str, str], body: bytes) -> Reply: ...
    async def stream(self, headers: dict[str, str]) -> StreamReply: ...
    async def websocket(self, headers: dict[str, str], max_size: int) -> ClientSocket:
        """Switch the connection to a WebSocket (101 with ``headers``); HttpRefusal when the request
        is not a valid upgrade."""
        ...


class RequestView(Protocol):
    """What the middlewares read of a request, and the per-request state they keep on it."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def query_string(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content_length(self) -> int | None: ...

    def __getitem__(self, key: web.RequestKey[T]) -> T: ...
    def __setitem__(self, key: web.RequestKey[T], value: T) -> None: ...
    @overload
    def get(self, key: web.RequestKey[T]) -> T | None: ...
    @overload
    def get(self, key: web.RequestKey[T], default: T) -> T: ...


class ProxyRequest(RequestView, Protocol):
    """A request the proxy forwards: its body, and how it is answered."""

    @property
    def body(self) -> bytes | None:
        """The whole body when it is here already (the front's requests), else None: :meth:`read`.

        Read first on every request: an attribute, where :meth:`read` makes a coroutine."""
        ...

    async def read(self) -> bytes: ...
    @property
    def responder(self) -> Responder: ...


class AiohttpResponder:
    """Answers for a request aiohttp serves: aiohttp's own response objects."""

    __slots__ = ("_request",)

    def __init__(self, request: web.Request) -> None:
        self._request = request

    def whole(self, status: int, headers: dict[str, str], body: bytes) -> web.Response:
        return web.Response(status=status, body=body, headers=headers)

    async def stream(self, headers: dict[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=headers)
        await response.prepare(self._request)
        return response

    async def websocket(self, headers: dict[str, str], max_size: int) -> ClientSocket:
        socket = web.WebSocketResponse(max_msg_size=max_size, autoclose=False)
        socket.headers.update(headers)
        if not socket.can_prepare(self._request).ok:
            raise HttpRefusal(400, "not_a_websocket", NOT_A_WEBSOCKET)
        await socket.prepare(self._request)
        return AiohttpSocket(socket)


NOT_A_WEBSOCKET = "This path is a WebSocket: connect with a WebSocket client (Upgrade: websocket)."


class AiohttpSocket:
    """aiohttp's WebSocket as a :class:`ClientSocket`."""

    def __init__(self, socket: web.WebSocketResponse) -> None:
        self._socket = self.response = socket

    @property
    def status(self) -> int:
        return 101

    @property
    def headers(self) -> MutableMapping[str, str]:
        return self._socket.headers

    @property
    def prepared(self) -> bool:
        return True

    async def receive(self) -> str | bytes:
        while True:
            message = await self._socket.receive()
            if message.type is WSMsgType.TEXT:
                return str(message.data)
            if message.type is WSMsgType.BINARY:
                return bytes(message.data)
            if message.type in (WSMsgType.PING, WSMsgType.PONG):
                continue
            code = self._socket.close_code or 1006
            if message.type is WSMsgType.ERROR:
                # aiohttp's own refusal (a message over max_msg_size): it has sent its close frame.
                raise SocketClosed(code, str(message.data), by_peer=False)
            raise SocketClosed(code, str(message.extra or ""), by_peer=message.type is WSMsgType.CLOSE)

    async def send(self, message: str | bytes) -> None:
        if self._socket.closed:
            raise ConnectionResetError("the client's WebSocket is closed")
        if isinstance(message, str):
            await self._socket.send_str(message)
        else:
            await self._socket.send_bytes(message)

    async def close(self, code: int, reason: str) -> None:
        if not self._socket.closed:
            await self._socket.close(code=code, message=reason.encode()[:123])

    async def closed(self) -> None:
        return None  # aiohttp's close waits for the client's close frame itself


class AiohttpRequest:
    """aiohttp's request as a :class:`ProxyRequest`: the same request (its state shared), and a
    responder of aiohttp's responses."""

    __slots__ = ("_request", "responder")

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.responder = AiohttpResponder(request)

    @property
    def method(self) -> str:
        return self._request.method

    @property
    def path(self) -> str:
        return self._request.path

    @property
    def query_string(self) -> str:
        return self._request.query_string

    @property
    def headers(self) -> Mapping[str, str]:
        return self._request.headers

    @property
    def content_length(self) -> int | None:
        return self._request.content_length

    @property
    def body(self) -> bytes | None:
        return None  # aiohttp reads it when asked

    async def read(self) -> bytes:
        return await self._request.read()

    def __getitem__(self, key: web.RequestKey[T]) -> T:
        return self._request[key]

    def __setitem__(self, key: web.RequestKey[T], value: T) -> None:
        self._request[key] = value

    @overload
    def get(self, key: web.RequestKey[T]) -> T | None: ...
    @overload
    def get(self, key: web.RequestKey[T], default: T) -> T: ...

    def get(self, key: web.RequestKey[T], default: T | None = None) -> T | None:
        return self._request.get(key, default)
