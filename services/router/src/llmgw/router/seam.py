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

from aiohttp import web

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


class Responder(Protocol):
    """How a request is answered on the server that has it."""

    def whole(self, status: int, headers: dict[str, str], body: bytes) -> Reply: ...
    async def stream(self, headers: dict[str, str]) -> StreamReply: ...


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
