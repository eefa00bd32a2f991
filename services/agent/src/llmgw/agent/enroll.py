"""A node certificate from a join token, obtained once at start (common/joining.py has the protocol).

The agent joins only when ``join.address`` is set and ``tls.cert_file`` does
not exist: a node that joined keeps its files and starts from them, so a
token used once is never needed again (and a restart never uses it up).
Unreachable or busy (UNAVAILABLE, RESOURCE_EXHAUSTED): tried again with
backoff until ``join.timeout_seconds``; refused (a token that is wrong,
expired, used or revoked; a server that is not the pinned cluster's): no
retry, the reason is the error's message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from llmgw.common.backoff import BackoffPolicy, Retries
from llmgw.common.errors import InvalidArgument, Unavailable
from llmgw.common.joining import JoinRefused, join, write

from .config import AgentConfig

log = logging.getLogger("llmgw.agent.enroll")

TOKEN_ENV = "LLMGW_JOIN_TOKEN"
BACKOFF = BackoffPolicy(initial=0.5, maximum=10.0)


def needs_join(config: AgentConfig) -> bool:
    return bool(config.join.address) and not Path(config.tls.cert_file).exists()


def read_token(config: AgentConfig, env: Mapping[str, str]) -> str:
    """The join token from $LLMGW_JOIN_TOKEN or join.token_file; InvalidArgument saying where to put it."""
    if env.get(TOKEN_ENV, "").strip():
        return env[TOKEN_ENV].strip()
    if not config.join.token_file:
        raise InvalidArgument(
            f"this node has no certificate ({config.tls.cert_file}) and no join token: set join.token_file "
            f"or ${TOKEN_ENV} (an admin makes one with `llmgw nodes join-token create`)"
        )
    try:
        return Path(config.join.token_file).read_text().strip()
    except OSError as err:
        raise InvalidArgument(f"join.token_file {config.join.token_file}: {err.strerror}") from None


def enroll(
    config: AgentConfig,
    env: Mapping[str, str],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Join, write the files; a line saying what was obtained. InvalidArgument or JoinRefused on failure."""
    token = read_token(config, env)
    hosts = [config.advertise_host] if config.advertise_host else []
    deadline = clock() + config.join.timeout_seconds
    retries = Retries(BACKOFF)
    while True:
        try:
            joined = join(config.join.address, token, config.join.ca_cert_hash, config.node_id, hosts)
            break
        except Unavailable as err:
            wait = retries.next()
            if clock() + wait > deadline:
                raise JoinRefused(f"gave up after {config.join.timeout_seconds:.0f} s: {err}") from None
            log.warning("join not possible yet (%s); retrying in %.1f s", err, wait)
            sleep(wait)
    write(config.tls, joined)
    where = ", ".join(joined.hosts) or "the address it connects from"
    return (
        f"node {config.node_id} joined: certificate {joined.serial} written to {config.tls.cert_file} "
        f"(engines published on {where})"
    )
