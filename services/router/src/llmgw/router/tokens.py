"""The token counts of an answer, read from the usage object at the end of its bytes.

Every answer the router relays is counted (:meth:`.metrics.RouterMetrics.answered`),
so this is a scan, not a JSON parse: from the last ``"usage"`` key, the
first ``"prompt_tokens"`` or ``"input_tokens"`` (the Responses and Messages
APIs' name) followed by ``:`` and digits, and likewise for
``"completion_tokens"`` or ``"output_tokens"``, blanks allowed around the
colon. A key followed by anything else (``null``, a string) is passed over
for the next one. Neither found: no usage (None); one found: the other is 0.

Compiled: services/router/setup.py builds this module with Cython
(pure-Python mode), where the scan after a key is a C loop over the bytes;
two regular-expression searches cost several times as much per answer
(docs/benchmarks.md). Uncompiled, the same source runs as ordinary Python.
"""

from __future__ import annotations

import cython

# Whether this module runs compiled (services/router/setup.py); the router logs it at startup.
COMPILED: bool = cython.compiled


def usage(body: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens from the last ``usage`` object in ``body``, or None."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return None
    return _scan(body, at)


@cython.cfunc
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(body=bytes, at=cython.Py_ssize_t, end=cython.Py_ssize_t, size=cython.Py_ssize_t)
def _scan(body: bytes, at: int) -> tuple[int, int] | None:
    """Both counts, from ``at`` on: each the first of its keys followed by a number."""
    prompt = completion = None
    end = len(body)
    while at < end and (prompt is None or completion is None):
        if body[at] == 34:  # a quote: perhaps a key
            if prompt is None:
                size = _key(body, at, b'"prompt_tokens"') or _key(body, at, b'"input_tokens"')
                if size:
                    prompt = _number(body, at + size)
            if completion is None:
                size = _key(body, at, b'"completion_tokens"') or _key(body, at, b'"output_tokens"')
                if size:
                    completion = _number(body, at + size)
        at += 1
    if prompt is None and completion is None:
        return None
    return (0 if prompt is None else prompt, 0 if completion is None else completion)


@cython.cfunc
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(body=bytes, key=bytes, at=cython.Py_ssize_t, k=cython.Py_ssize_t, size=cython.Py_ssize_t)
@cython.returns(cython.Py_ssize_t)
def _key(body: bytes, at: int, key: bytes) -> int:
    """``key``'s length if it is in ``body`` at ``at``, else 0."""
    size = len(key)
    if at + size > len(body):
        return 0
    for k in range(size):
        if body[at + k] != key[k]:
            return 0
    return size


@cython.cfunc
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(
    body=bytes,
    at=cython.Py_ssize_t,
    end=cython.Py_ssize_t,
    start=cython.Py_ssize_t,
    c=cython.int,
    value=cython.longlong,
)
def _number(body: bytes, at: int) -> int | None:
    """The digits after blanks, a colon and blanks at ``at``, as an int; None if not there."""
    end = len(body)
    at = _blanks(body, at)
    if at >= end or body[at] != 58:  # ":"
        return None
    at = _blanks(body, at + 1)
    start, value = at, 0
    while at < end:
        c = body[at]
        if c < 48 or c > 57:
            break
        value = value * 10 + (c - 48)
        at += 1
    if at == start:
        return None
    # Up to 18 digits fit the C integer the compiled loop adds them in; more are read whole.
    return value if at - start <= 18 else int(body[start:at])


@cython.cfunc
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(body=bytes, at=cython.Py_ssize_t, end=cython.Py_ssize_t)
@cython.returns(cython.Py_ssize_t)
def _blanks(body: bytes, at: int) -> int:
    """The first offset from ``at`` that is not a blank (space, tab, CR, LF, FF or VT)."""
    end = len(body)
    while at < end and body[at] in b" \t\n\r\f\v":
        at += 1
    return at
