"""HTTPS for the router's clients, optional: a server SSL context that follows its files.

Off by default (``https`` unset in the config): most deployments terminate
TLS in front of the router. On, the router serves TLS with
``https.cert_file`` (the certificate chain) and ``https.key_file``, and
reads them again when one changes, without a restart: the context's
server-name callback, which OpenSSL runs at every handshake (SNI or not),
checks the files' stamps and hands the handshake a context built from the
new files. Connections already open keep theirs. A pair that does not load
(a key not matching its certificate: a rotation caught between its two
writes) is logged and ignored; the previous pair goes on serving.
"""

from __future__ import annotations

import logging
import os
import ssl

log = logging.getLogger(__name__)


def _context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class ReloadingContext:
    def __init__(self, cert_file: str, key_file: str) -> None:
        self._files = (cert_file, key_file)
        self._seen = self._stamp()
        self._current = _context(cert_file, key_file)
        # The listening context: its callback picks the current one per handshake.
        self.context = _context(cert_file, key_file)
        self.context.sni_callback = self._pick

    def _stamp(self) -> tuple[tuple[int, int, int] | None, ...]:
        stamps: list[tuple[int, int, int] | None] = []
        for path in self._files:
            try:
                st = os.stat(path)
            except OSError:
                stamps.append(None)
                continue
            stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(stamps)

    def _pick(self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        stamp = self._stamp()
        if stamp != self._seen:
            try:
                self._current = _context(*self._files)
                self._seen = stamp
                log.info("HTTPS certificate changed: new connections use %s", self._files[0])
            except (OSError, ssl.SSLError) as err:
                log.warning("keeping the current HTTPS certificate: %s", err)
        connection.context = self._current
