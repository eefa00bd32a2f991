"""Federation at run time: check the peer clusters, offer their models while they answer.

Each peer of the settings (:mod:`llmgw.control.spec.federation`) is checked
every ``check_interval_seconds``: ``GET <url>/v1/models`` with its key, as
any OpenAI client would ask. A peer that answers with a model list is
healthy, and each model it lists that the settings ask for becomes the
catalog model ``PEER/MODEL``, an external model whose provider is the
peer's router (:func:`peer_model`). What :func:`offered` returns is handed to
the controller (``set_federated``), which merges it into the catalog (a
local name wins; the clash is kept for ``llmgw peers``) and publishes it:
routers route a peer's model through the path they use for any external
provider, with the hop header and the origin tag (router/federation).

Decisions:

- **One failed check withdraws.** A peer that refuses the connection,
  times out, answers an error or an unreadable list is down for this
  cluster until its next good answer; its models leave the catalog (and
  every router's table) in the pass after the check. Requests for a model
  a peer just lost would fail anyway, and a local fallback answers them
  instead; waiting for several failures would only lengthen that window.
- **Every control plane checks, the leader publishes.** The checks are a
  handful of small GETs per interval, so standbys make them too: a new
  leader then writes a catalog with the peers' models from its first pass,
  instead of dropping them from every router for an interval after a
  failover; and any control plane answers ``ListPeers``.
- **Checks run concurrently, each bounded** by ``check_timeout_seconds``
  (capped at the interval) and by a 4 MiB answer, so one slow peer cannot
  delay the others' results or the next round.
- **Only changes are handed on**: the controller is told when the set of
  offered models changes, not every round.

Metrics (:class:`PeerCollector`, read from the last checks at each scrape;
every declared peer has every series):

- ``llmgw_control_peer_up{peer}``: 1 when its last check passed, else 0;
- ``llmgw_control_peer_models_offered{peer}``: its models offered here;
- ``llmgw_control_peer_last_check_timestamp_seconds{peer}`` (0: none yet);
- ``llmgw_control_peer_check_failures_total{peer}``: failed checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from llmgw.common.errors import excerpt

from ..spec.catalog import Model, PeerLink
from ..spec.federation import Federation as FederationSettings
from ..spec.federation import Peer
from ..spec.model import External, ModelSpec

log = logging.getLogger("llmgw.control.leader.federation")

# A model list larger than this is not a model list.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
MAX_KEY_BYTES = 16 * 1024


class PeerCheckFailed(Exception):
    """A peer did not answer its check with a model list; the message says why."""


class PeerCheck(Protocol):
    """Asks one peer which models it serves."""

    async def models(self, peer: Peer, limit_seconds: float) -> list[str]: ...


class Sink(Protocol):
    def set_federated(self, models: Iterable[Model]) -> None: ...


@dataclass(frozen=True)
class PeerState:
    """One peer as the last check found it."""

    peer: Peer
    # None: not checked yet.
    healthy: bool | None = None
    # Wall-clock time of the last check (0: none).
    checked_at: float = 0.0
    error: str = ""
    # The peer's own names of the models it listed that the settings ask for.
    listed: tuple[str, ...] = ()
    # Names the settings list that the peer does not.
    missing: tuple[str, ...] = ()

    @property
    def health(self) -> str:
        return "unchecked" if self.healthy is None else "healthy" if self.healthy else "unhealthy"


def peer_model(peer: Peer, name: str, cluster: str, hop_limit: int) -> Model | None:
    """The catalog model ``PEER/NAME`` served by ``peer``'s router; None when that name is not valid here."""
    try:
        spec = ModelSpec(
            name=f"{peer.name}/{name}",
            external=External(url=peer.url, model=name, api_key_file=peer.api_key_file),
            owned_by=f"peer {peer.name}",
        )
    except ValueError:
        return None
    link = PeerLink(peer.name, cluster if peer.send_tags else "", hop_limit)
    return replace(Model.from_spec(spec), origin="peer", peer=link)


def offered(states: Iterable[PeerState], cluster: str, hop_limit: int) -> list[Model]:
    """The catalog models of every healthy peer's listed models, in peer then model order."""
    out: list[Model] = []
    for state in states:
        if not state.healthy:
            continue
        for name in state.listed:
            model = peer_model(state.peer, name, cluster, hop_limit)
            if model is None:
                # Every round would say it again: debug, not a warning per interval.
                log.debug("peer %s lists model %r, which is not a valid name here", state.peer.name, name)
                continue
            out.append(model)
    return out


def judge(peer: Peer, listed: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a healthy peer offers of what its settings ask for, and what it does not list."""
    names = list(dict.fromkeys(listed))
    if peer.models == "all":
        return tuple(names), ()
    have = set(names)
    return tuple(n for n in peer.models if n in have), tuple(n for n in peer.models if n not in have)


class PeerChecker:
    """Runs the checks; holds the last state of each peer; tells the sink what to offer."""

    def __init__(
        self,
        check: PeerCheck,
        sink: Sink,
        cluster: str,
        settings: FederationSettings | None = None,
        wall: Callable[[], float] = time.time,
    ):
        self._check = check
        self._sink = sink
        self._cluster = cluster
        self._wall = wall
        self._settings = settings or FederationSettings()
        self._states: dict[str, PeerState] = {}
        self._offered: tuple[tuple[object, ...], ...] = ()
        self._wake = asyncio.Event()
        # Failed checks per peer name, for as long as this process runs.
        self.failures: dict[str, int] = {}

    @property
    def settings(self) -> FederationSettings:
        return self._settings

    def configure(self, settings: FederationSettings) -> None:
        """Put new federation settings in force: checked again at once, removed peers withdrawn."""
        if settings == self._settings:
            return
        self._settings = settings
        self._states = {p.name: self._states.get(p.name, PeerState(p)) for p in settings.peers}
        # A peer whose settings changed is checked again before it is trusted.
        for p in settings.peers:
            if self._states[p.name].peer != p:
                self._states[p.name] = PeerState(p)
        self._publish()
        self._wake.set()

    def peers(self) -> list[PeerState]:
        return [self._states.get(p.name, PeerState(p)) for p in self._settings.peers]

    async def run(self) -> None:
        """Check every peer each interval, for ever (cancel to stop)."""
        while True:
            self._wake.clear()
            if self._settings.peers:
                try:
                    await self.check_all()
                except Exception:  # a round never ends the loop
                    log.exception("checking the peers failed; the next round starts from scratch")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.check_interval_seconds):
                    await self._wake.wait()

    async def check_all(self) -> None:
        """One round: every peer checked at once; the sink told if what is offered changed."""
        settings = self._settings
        peers = list(settings.peers)
        results = await asyncio.gather(*(self._check_one(p, settings.timeout_seconds) for p in peers))
        if settings is not self._settings:
            return  # reconfigured meanwhile: the new settings' round decides
        for state in results:
            before = self._states.get(state.peer.name)
            if before is not None and before.healthy is not False and state.healthy is False:
                log.warning(
                    "peer %s failed its check (%s); its models are withdrawn", state.peer.name, state.error
                )
            elif state.healthy and (before is None or not before.healthy):
                offers = ", ".join(state.listed) or "nothing"
                log.info("peer %s is healthy; offering %s", state.peer.name, offers)
            self._states[state.peer.name] = state
        self._publish()

    async def _check_one(self, peer: Peer, limit_seconds: float) -> PeerState:
        now = self._wall()
        try:
            listed = await self._check.models(peer, limit_seconds)
        except PeerCheckFailed as err:
            self.failures[peer.name] = self.failures.get(peer.name, 0) + 1
            return PeerState(peer, False, now, str(err))
        except Exception as err:  # a check that failed in a way nobody foresaw still fails the peer
            log.exception("checking peer %s failed unexpectedly", peer.name)
            self.failures[peer.name] = self.failures.get(peer.name, 0) + 1
            return PeerState(peer, False, now, f"the check failed: {type(err).__name__}: {err}")
        offers, missing = judge(peer, listed)
        return PeerState(peer, True, now, "", offers, missing)

    def _publish(self) -> None:
        models = offered(self.peers(), self._cluster, self._settings.hop_limit)
        key = tuple((m.name, m.spec, m.peer) for m in models)
        if key != self._offered:
            self._offered = key
            self._sink.set_federated(models)


class PeerCollector(Collector):
    """The peers' health as Prometheus series (see the module docstring)."""

    def __init__(self, checker: PeerChecker) -> None:
        self._checker = checker

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = GaugeMetricFamily(
            "llmgw_control_peer_up", "1 when the peer's last check passed.", labels=["peer"]
        )
        models = GaugeMetricFamily(
            "llmgw_control_peer_models_offered", "The peer's models offered here.", labels=["peer"]
        )
        last = GaugeMetricFamily(
            "llmgw_control_peer_last_check_timestamp_seconds",
            "Unix time of the peer's last check (0: none yet).",
            labels=["peer"],
        )
        failures = CounterMetricFamily(
            "llmgw_control_peer_check_failures", "Checks of the peer that failed.", labels=["peer"]
        )
        for state in self._checker.peers():
            name = state.peer.name
            up.add_metric([name], 1.0 if state.healthy else 0.0)
            models.add_metric([name], float(len(state.listed)) if state.healthy else 0.0)
            last.add_metric([name], state.checked_at)
            failures.add_metric([name], float(self._checker.failures.get(name, 0)))
        yield from (up, models, last, failures)


class HttpPeerCheck:
    """:class:`PeerCheck` over HTTP: ``GET <url>/v1/models`` with the peer's key, as a client asks."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def models(self, peer: Peer, limit_seconds: float) -> list[str]:
        headers = {"Accept": "application/json"}
        if peer.api_key_file:
            headers["Authorization"] = f"Bearer {read_key(peer.api_key_file)}"
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = peer.url + "/v1/models"
        try:
            limit = aiohttp.ClientTimeout(total=limit_seconds)
            async with self._session.get(url, headers=headers, timeout=limit, allow_redirects=False) as resp:
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise PeerCheckFailed(f"{url} answered more than {MAX_ANSWER_BYTES} bytes")
                    chunks.append(chunk)
                body = b"".join(chunks)
                if resp.status in (401, 403):
                    raise PeerCheckFailed(
                        f"{url} answered {resp.status}: {excerpt(_message(body))}; the key in "
                        f"{peer.api_key_file or '(no api_key_file)'} must be a client key of the peer's"
                    )
                if resp.status != 200:
                    raise PeerCheckFailed(f"{url} answered {resp.status}: {excerpt(_message(body))}")
        except TimeoutError:
            raise PeerCheckFailed(f"{url} did not answer within {limit_seconds:g}s") from None
        except aiohttp.ClientError as err:
            raise PeerCheckFailed(f"{url}: {type(err).__name__}: {err}") from None
        return parse_model_list(body, url)


def parse_model_list(body: bytes, url: str) -> list[str]:
    """The ids of an OpenAI ``/v1/models`` answer; PeerCheckFailed when it is not one."""
    try:
        doc = json.loads(body)
        data = doc["data"]
        if not isinstance(data, list):
            raise TypeError("data is not a list")
        ids = [item["id"] for item in data]
        if not all(isinstance(i, str) for i in ids):
            raise TypeError("an id is not a string")
    except (ValueError, KeyError, TypeError) as err:
        raise PeerCheckFailed(f"{url} did not answer an OpenAI model list ({err})") from None
    return ids


def _message(body: bytes) -> str:
    """An OpenAI error's message, or the start of the body."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


def read_key(path: str) -> str:
    """A peer key from its file (one line); PeerCheckFailed naming the file when it cannot be."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_KEY_BYTES + 1)
    except OSError as err:
        raise PeerCheckFailed(f"the key file {path} cannot be read ({os.strerror(err.errno or 0)})") from None
    key = raw.decode("utf-8", "replace").strip()
    if not key or len(raw) > MAX_KEY_BYTES or "\n" in key:
        raise PeerCheckFailed(f"the key file {path} does not hold one key on one line")
    return key
