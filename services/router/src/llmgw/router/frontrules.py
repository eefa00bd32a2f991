"""What the front refuses in a head llhttp accepted, and how it reads a request's target.

llhttp checks a request's syntax (:mod:`.front` maps its errors); these are
the rules of HTTP it leaves to the server: one well-formed ``Host`` on
HTTP/1.1 (RFC 9112 §3.2), the versions and transfer codings the router
speaks, ``Expect``, and the router's own limits. Each refusal is an
:class:`.errors.HttpRefusal`, which becomes an OpenAI-shaped JSON error.
Compiled with the wire modules (services/router/setup.py): it runs for
every request's head.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

import cython
import httptools

from .config import Limits
from .errors import HttpRefusal

# Whether this module runs compiled (services/router/setup.py); the router logs it at startup.
COMPILED: bool = cython.compiled

# A Host field's value (RFC 9110 §7.2: uri-host [":" port]); an IPv6 literal in brackets.
HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::[0-9]*)?")
# Host values found well-formed, and request targets read (target -> path, query): clients send
# the same few again and again. Both are the client's bytes, so each is bounded: emptied when
# it holds MAX_KEPT, and none longer than MAX_KEPT_BYTES is kept (at most 64 KiB of keys each).
MAX_KEPT = 256
MAX_KEPT_BYTES = 256
_GOOD_HOSTS: set[bytes] = set()
_TARGETS: dict[bytes, tuple[str, str]] = {}


def head_refusal(
    version: str,
    hosts: list[bytes],
    coding: bytes | None,
    expect: bytes | None,
) -> HttpRefusal | None:
    """Why a head llhttp parsed is refused, if it is: its version, its ``Host`` fields, its
    ``Transfer-Encoding`` and ``Expect`` as sent (None when absent). Its ``Content-Length``
    against ``limits.max_body_bytes`` is the connection's to check (:mod:`.frontconn`)."""
    if version not in ("1.1", "1.0"):
        return HttpRefusal(505, "http_version_not_supported", "This router speaks HTTP/1.1 and 1.0.")
    if (version == "1.1" and len(hosts) != 1) or len(hosts) > 1:
        return HttpRefusal(400, "bad_request", "An HTTP/1.1 request needs exactly one Host field.")
    if hosts and hosts[0] not in _GOOD_HOSTS:
        if not HOST.fullmatch(hosts[0].strip()):
            return HttpRefusal(400, "bad_request", "The Host field is not a host name and port.")
        if len(hosts[0]) <= MAX_KEPT_BYTES:
            if len(_GOOD_HOSTS) >= MAX_KEPT:
                _GOOD_HOSTS.clear()
            _GOOD_HOSTS.add(hosts[0])
    if coding is not None:
        if version == "1.0":
            return HttpRefusal(400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request.")
        if coding.strip().lower() != b"chunked":
            return HttpRefusal(
                501, "not_implemented", "Only the chunked transfer coding is accepted in a request."
            )
    if expect is not None and expect.strip().lower() != b"100-continue":
        return HttpRefusal(417, "expectation_failed", "Only Expect: 100-continue is supported.")
    return None


def target(url: bytes) -> tuple[str, str]:
    """The path (percent-decoded) and query of a request target, as aiohttp has them.

    llhttp has checked the target's characters (no control byte, no byte
    over 0x7F). An absolute-form target (``http://host/path``) is read for
    its path and query.
    """
    found = _TARGETS.get(url)
    if found is None:
        found = _target(url)
        if len(url) <= MAX_KEPT_BYTES:
            if len(_TARGETS) >= MAX_KEPT:
                _TARGETS.clear()
            _TARGETS[url] = found
    return found


def _target(url: bytes) -> tuple[str, str]:
    if not url.startswith(b"/"):
        try:
            parsed = httptools.parse_url(url)
        except httptools.HttpParserInvalidURLError:
            return "", ""  # no route has it: a 404
        raw_path, raw_query = parsed.path or b"/", parsed.query or b""
    else:
        raw_path, _, raw_query = url.partition(b"?")
        raw_query = raw_query.partition(b"#")[0]
    path = raw_path.decode("ascii")
    if "%" in path:
        path = unquote(path, errors="surrogateescape")
    return path, raw_query.decode("ascii")


def head_too_large(limits: Limits) -> HttpRefusal:
    return HttpRefusal(
        431,
        "headers_too_large",
        f"The request head is over {limits.max_head_bytes} bytes (limits.max_head_bytes).",
    )


def body_too_large(limits: Limits) -> HttpRefusal:
    return HttpRefusal(
        413,
        "request_too_large",
        f"The request body is over {limits.max_body_bytes} bytes (limits.max_body_bytes). "
        "Send a smaller request body.",
    )
