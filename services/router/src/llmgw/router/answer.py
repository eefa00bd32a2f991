"""A whole answer to a request the router's front serves, as light as what the front writes.

The forwarder makes one for every non-streamed answer the front serves
(:mod:`.front`): a status, the router's few headers, the engine's body. An
``aiohttp.web.Response`` in its place builds a case-insensitive multidict
of the headers and sets up compression, cookies and a payload writer the
front never uses, and being a ``MutableMapping`` makes each ``isinstance``
test of it a call into ``ABCMeta``: together about a tenth of the router's
own work on a small answer. A request aiohttp serves still gets aiohttp's
``Response`` (:func:`served_by_aiohttp` tells which server has a request).

The handler chain reads it as it reads aiohttp's: ``status``, ``headers``
(a ``dict``, so ``setdefault`` works), ``body`` and ``prepared`` (never:
the front writes it once the chain returns).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from aiohttp import web

_REASONS = {status.value: status.phrase for status in HTTPStatus}


class Answer:
    """A status, headers and a whole body, for the front to write."""

    __slots__ = ("body", "headers", "reason", "status")

    prepared = False

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.reason = _REASONS.get(status, "")
        self.headers = headers
        self.body = body

    def __repr__(self) -> str:
        return f"<Answer {self.status} {self.reason}, {len(self.body)} bytes>"


def served_by_aiohttp(request: Any) -> bool:
    """Whether ``request`` is aiohttp's (the app's own server), not the front's ``FrontRequest``.

    aiohttp hands its handlers ``web.Request`` exactly; a type test, since an
    ``isinstance`` test of an aiohttp request (a ``MutableMapping``) is a
    call into ``ABCMeta`` on every request.
    """
    return type(request) is web.Request
