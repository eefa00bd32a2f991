"""The agent's renewal loop (agent/renewal.py): when it renews, and how it retries and warns.

The control plane here is a port nobody listens on (a real failed
connection); the loop's clock and sleep are its declared seams, so the
test can stand at any point of a certificate's life without waiting.
"""

from __future__ import annotations

import logging
import random

import pytest

from llmgw.agent.config import AgentConfig
from llmgw.agent.renewal import BACKOFF, Current, due, read_current, renew_forever
from llmgw.common import pki
from llmgw.common.tls import TlsSettings
from tests.support.procs import free_port


class Stop(Exception):
    pass


@pytest.fixture
def config(tmp_path) -> AgentConfig:
    pki.create_ca(tmp_path, "unit")
    crt, key = pki.issue(tmp_path, "node", "n1", (), days=1)
    tls = TlsSettings(ca_file=str(tmp_path / "ca.crt"), cert_file=str(crt), key_file=str(key))
    return AgentConfig(node_id="n1", control=[f"127.0.0.1:{free_port()}"], tls=tls)


def test_due_is_after_the_share_plus_jitter_of_the_lifetime():
    cert = Current("ab", not_before=1000.0, not_after=1300.0, hosts=())
    rng = random.Random(7)
    whens = [due(cert, 0.67, 0.1, rng) for _ in range(200)]
    assert all(1000 + 0.67 * 300 <= w <= 1000 + 0.77 * 300 for w in whens)
    assert max(whens) - min(whens) > 0.05 * 300, "jittered, so nodes do not renew together"


async def _run(config: AgentConfig, at: float, attempts: int) -> list[float]:
    """Run the loop with the clock at ``at`` (seconds past not_before) until ``attempts`` waits."""
    start = read_current(config.tls.cert_file).not_before
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) >= attempts:
            raise Stop

    with pytest.raises(Stop):
        await renew_forever(config, wall=lambda: start + at, sleep=sleep, rng=random.Random(1))
    return waits


async def test_before_it_is_due_nothing_is_asked(config, caplog):
    waits = await _run(config, at=60.0, attempts=2)
    # A day's certificate is due after about 16 h: the loop only looks at the file again each minute.
    assert waits == [60.0, 60.0]
    assert "could not be renewed" not in caplog.text


async def test_failures_are_retried_with_backoff_and_never_later_than_a_quarter_of_what_is_left(
    config, caplog
):
    current = read_current(config.tls.cert_file)
    at = current.lifetime * 0.8  # due, a fifth of the lifetime left
    with caplog.at_level(logging.WARNING, "llmgw.agent.renewal"):
        waits = await _run(config, at=at, attempts=6)
    left = current.lifetime - at
    assert all(BACKOFF.initial <= w <= min(BACKOFF.maximum, left / 4) for w in waits)
    assert waits[-1] > waits[0], "backing off"
    failures = [r for r in caplog.records if "could not be renewed" in r.getMessage()]
    assert len(failures) == 6 and all(r.levelno == logging.WARNING for r in failures)
    assert "UNAVAILABLE" in failures[0].getMessage()


async def test_the_warning_becomes_an_error_near_expiry_and_after_it(config, caplog):
    current = read_current(config.tls.cert_file)
    with caplog.at_level(logging.WARNING, "llmgw.agent.renewal"):
        await _run(config, at=current.lifetime * 0.95, attempts=1)
        await _run(config, at=current.lifetime + 10, attempts=1)
    near, expired = [r for r in caplog.records if "renew" in r.getMessage()]
    assert near.levelno == logging.ERROR and "expires in" in near.getMessage()
    assert expired.levelno == logging.ERROR and "EXPIRED" in expired.getMessage()
    assert "join token" in expired.getMessage()
