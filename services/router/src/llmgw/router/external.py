"""External providers: the key of an OpenAI-compatible provider, read from its file.

A model whose catalog entry is ``external`` has one endpoint,
``external:<model>`` (see :func:`.table.external_endpoint`), routed like a
replica (breaker, retries, in-flight count), except that its bearer key is
not derived from the cluster secret: it is the content of the entry's
``api_key_file``, read on this router's host.

Decisions:

- **Rotation without restart.** A key is looked up per request through
  :class:`KeyFiles`, which re-checks the file at most every
  ``recheck_seconds`` (one ``stat``) and re-reads it only when its inode,
  size or modification time changed. A key rotated in place or by an atomic
  rename is therefore used within that interval, and the hot path pays a
  dictionary lookup, not a file read.
- **A file that goes bad keeps the last good key.** A provider key file is
  usually replaced by a secret manager, which can briefly leave it missing
  or empty; the last key read keeps working (with a warning) until a good
  one appears. Only a file that has never been readable fails the request,
  with a 500 that names the file.
- **Blocking reads, deliberately.** A key file is a few bytes on local
  disk; a ``stat`` once a second does not justify a thread hop per request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.common.errors import LlmgwError

log = logging.getLogger(__name__)

# Larger than any API key; a file this big is not one.
MAX_KEY_BYTES = 16 * 1024


class KeyFileUnreadable(LlmgwError):
    """A provider key file has never been readable; the request cannot be authenticated."""


@dataclass
class _Entry:
    key: str
    # (inode, size, mtime in ns) of the file the key was read from.
    signature: tuple[int, int, int]
    checked_at: float


class KeyFiles:
    """Provider keys by file path, re-read when the file changes.

    Called only from the event loop; ``clock`` is monotonic seconds.
    """

    def __init__(self, clock: Callable[[], float], recheck_seconds: float = 1.0) -> None:
        self._clock = clock
        self._recheck = recheck_seconds
        self._entries: dict[str, _Entry] = {}

    def key(self, path: str) -> str:
        now = self._clock()
        entry = self._entries.get(path)
        if entry is not None and now - entry.checked_at < self._recheck:
            return entry.key
        try:
            st = os.stat(path)
            signature = (st.st_ino, st.st_size, st.st_mtime_ns)
            if entry is not None and entry.signature == signature:
                entry.checked_at = now
                return entry.key
            key = _read(path)
        except (OSError, ValueError) as err:
            return self._unreadable(path, entry, now, err)
        if entry is not None:
            log.info("provider key file %s changed; using the new key", path)
        self._entries[path] = _Entry(key, signature, now)
        return key

    def _unreadable(self, path: str, entry: _Entry | None, now: float, err: Exception) -> str:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        if entry is None:
            raise KeyFileUnreadable(
                f"The provider key file {path} cannot be read ({reason}); the operator must make it "
                "readable by the router (one line: the key)."
            )
        log.warning("provider key file %s cannot be read (%s); keeping the last key read", path, reason)
        entry.checked_at = now
        return entry.key


def _read(path: str) -> str:
    with open(path, "rb") as f:
        raw = f.read(MAX_KEY_BYTES + 1)
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"the file is over {MAX_KEY_BYTES} bytes, too large for a key")
    key = raw.decode("utf-8", errors="strict").strip()
    if not key:
        raise ValueError("the file is empty")
    if any(c in key for c in "\r\n"):
        raise ValueError("the key spans several lines")
    return key
