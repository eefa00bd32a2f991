"""A whole answer to a request the router's front serves, as light as what the front writes.

The forwarder makes one for every non-streamed answer the front serves
(:mod:`.front`): a status, the router's few headers, the engine's body. An
``aiohttp.web.Response`` in its place builds a case-insensitive multidict
of the headers and sets up compression, cookies and a payload writer the
front never uses, and being a ``MutableMapping`` makes each ``isinstance``
test of it a call into ``ABCMeta``: together about a tenth of the router's
own work on a small answer. A request aiohttp serves gets aiohttp's
``Response`` instead (each server's responder makes its own: :mod:`.seam`).

The handler chain reads it as it reads aiohttp's: ``status``, ``headers``
(a ``dict``, so ``setdefault`` works), ``body`` and ``prepared`` (never:
the front writes it once the chain returns).
"""

from __future__ import annotations

from http import HTTPStatus

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
