"""Who an HTTP caller is: a Bearer token, or the console's session cookie (with CSRF).

A script sends ``Authorization: Bearer TOKEN``; the header is handed to the
gRPC interceptors as the same metadata a gRPC client sends, so the check
(and its messages) is theirs.

The console logs in once with the admin token (``POST /api/v1/session``)
and gets a session cookie: ``<expiry>.<nonce>.<signature>``, an HMAC of
expiry and nonce keyed by the admin token. Stateless on purpose: every
control plane (leader or standby, behind one balancer) accepts it, a
restart keeps it, and replacing the admin token ends every session. The
cookie is HttpOnly (page scripts cannot read it), SameSite=Strict (no other
site's page sends it), Secure when the request came over HTTPS, and lasts
:data:`SESSION_SECONDS`. Every change made with it (any method but GET and
HEAD) also needs ``X-CSRF-Token``: an HMAC of the nonce, which the login
and ``GET /api/v1/session`` answer and the page keeps in memory only (no
token in URLs or local storage). Logging out clears the cookie; a copied
cookie stays valid until it expires (the price of statelessness; rotate
the admin token to end all sessions at once).

A cookie request is passed to the interceptors as the admin token, once
the cookie's signature checks.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

import grpc
from aiohttp import web

from .transcode import Aborted

COOKIE = "llmgw_session"
CSRF_HEADER = "X-CSRF-Token"
SESSION_SECONDS = 12 * 3600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Sessions:
    def __init__(self, admin_token: str, wall: Callable[[], float] = time.time):
        self._token = admin_token
        self._key = hashlib.sha256(b"llmgw console session\0" + admin_token.encode()).digest()
        self._wall = wall

    @property
    def enabled(self) -> bool:
        return bool(self._token)

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> tuple[str, str, int]:
        """A new session: (cookie value, CSRF token, expiry in Unix seconds)."""
        expires = int(self._wall()) + SESSION_SECONDS
        nonce = secrets.token_urlsafe(16)
        cookie = f"{expires}.{nonce}.{self._sign(f'session:{expires}:{nonce}')}"
        return cookie, self._sign(f"csrf:{nonce}"), expires

    def check(self, cookie: str) -> tuple[str, int] | None:
        """(CSRF token, expiry) of a valid, unexpired cookie; None otherwise."""
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[0].isdigit() or len(parts[0]) > 12:
            return None
        expires, nonce, signature = int(parts[0]), parts[1], parts[2]
        if not hmac.compare_digest(signature, self._sign(f"session:{expires}:{nonce}")):
            return None
        if expires <= self._wall():
            return None
        return self._sign(f"csrf:{nonce}"), expires

    def metadata(self, request: web.Request) -> list[tuple[str, str]]:
        """The gRPC metadata this request stands for; Aborted when its cookie use is unsafe."""
        header = request.headers.get("Authorization")
        if header is not None:
            return [("authorization", header)]
        cookie = request.cookies.get(COOKIE)
        if cookie is None:
            return []
        session = self.check(cookie)
        if session is None:
            raise Aborted(grpc.StatusCode.UNAUTHENTICATED, "the console session has expired; log in again")
        csrf, _ = session
        if request.method not in SAFE_METHODS:
            given = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(given.encode(), csrf.encode()):
                raise Aborted(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"a change made with the session cookie needs the {CSRF_HEADER} header "
                    "(the console sends it; scripts use Authorization: Bearer TOKEN instead)",
                )
        return [("authorization", f"Bearer {self._token}")]

    def set_cookie(
        self, request: web.Request, response: web.StreamResponse, value: str, expires: int
    ) -> None:
        response.set_cookie(
            COOKIE,
            value,
            max_age=max(0, expires - int(self._wall())),
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure or request.headers.get("X-Forwarded-Proto") == "https",
        )

    @staticmethod
    def clear_cookie(response: web.StreamResponse) -> None:
        response.del_cookie(COOKIE, path="/")
