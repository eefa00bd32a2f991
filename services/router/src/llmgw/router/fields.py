"""A head's header fields, found in its bytes when asked for.

The router reads a handful of fields of each head it handles (the framing,
a request id, the trace context, a session id, a key, the content type),
while clients send a dozen or more (the OpenAI SDK sends fifteen).
:class:`Fields` keeps the head's bytes and finds a field when it is asked
for, instead of building a dictionary of every field first: a search in a
few hundred bytes costs less than a dozen insertions, and the router pays
it on every request and every answer.

Semantics are ``CIMultiDict``'s where they meet: names are matched without
regard to (ASCII) case; a repeated field answers with its first value;
iteration and ``items()`` see every field in order, repeats included (so
``CIMultiDict(fields)`` copies them all). Values are decoded as aiohttp
decodes them (UTF-8, undecodable bytes kept as surrogates) and stripped of
surrounding blanks.

The bytes are llhttp's fields, rejoined (:mod:`.front`,
:mod:`.upstream_wire`): llhttp has checked that every name is a token and
no value holds a CR, LF or NUL, so a line is always one field and framing
is llhttp's to judge, never this module's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeVar, overload

_T = TypeVar("_T")

# Field name -> what starts its line in lowered bytes; names are the callers' constants.
_NEEDLES: dict[str, bytes] = {}


def needle(name: str) -> bytes:
    """``b"\\r\\n" + name + b":"``, lowered: what starts the field ``name``'s line."""
    found = _NEEDLES.get(name)
    if found is None:
        if len(_NEEDLES) >= 256:
            _NEEDLES.clear()
        found = _NEEDLES[name] = b"\r\n" + name.lower().encode("latin-1") + b":"
    return found


def pick(headers: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    """Each of ``names`` present in ``headers``, with its value, in that order.

    On :class:`Fields` an absent name costs one search, not a lookup.
    """
    found = {}
    if type(headers) is Fields:
        lowered = headers.lowered
        for name in names:
            # find, not ``in``: a bytes ``in`` costs twice a find (it tries the operand as an int first).
            if lowered.find(_NEEDLES.get(name) or needle(name)) >= 0:
                found[name] = headers[name]
    else:
        for name in names:
            value = headers.get(name)
            if value is not None:
                found[name] = value
    return found


class Fields(Mapping[str, str]):
    """The fields of one head: ``raw`` is its field lines, each line starting with CRLF."""

    __slots__ = ("_pairs", "lowered", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        # bytes.lower() lowers ASCII only, so offsets into it are offsets into raw.
        self.lowered = raw.lower()
        self._pairs: list[tuple[str, str]] | None = None

    @overload
    def get(self, name: str) -> str | None: ...
    @overload
    def get(self, name: str, default: str) -> str: ...
    @overload
    def get(self, name: str, default: _T) -> str | _T: ...

    def get(self, name: str, default: object = None) -> object:
        key = _NEEDLES.get(name) or needle(name)
        at = self.lowered.find(key)
        if at < 0:
            return default
        start = at + len(key)
        end = self.raw.find(b"\r\n", start)
        value = self.raw[start:end] if end >= 0 else self.raw[start:]
        return value.decode("utf-8", "surrogateescape").strip(" \t")

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.lowered.find(needle(name)) >= 0

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.items())

    def __len__(self) -> int:
        return len(self.items())

    def items(self) -> list[tuple[str, str]]:  # type: ignore[override]
        """Every field in order, repeats included."""
        if self._pairs is None:
            pairs = []
            for line in self.raw.decode("utf-8", "surrogateescape").split("\r\n"):
                name, sep, value = line.partition(":")
                if sep and name and name[-1] not in " \t":
                    pairs.append((name, value.strip(" \t")))
            self._pairs = pairs
        return self._pairs

    def __repr__(self) -> str:
        return f"Fields({self.items()!r})"
