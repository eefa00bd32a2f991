"""``/metrics`` for every worker, from whichever worker a scrape reaches.

With SO_REUSEPORT the kernel hands a scrape of the shared port to any one
worker, and each worker counts only its own requests: exposed as is, the
counters would jump between workers' values from one scrape to the next,
which Prometheus reads as resets. So each worker also listens on a unix
socket of its own (in a directory private to the supervisor), and the
worker a scrape reaches asks its siblings for their own series
(``/metrics?scope=worker``) and answers with everyone's, each sample
labelled ``worker="<n>"``. Per worker, not summed: a worker that restarts
resets only its own series, which Prometheus handles per series, and
``sum without (worker)`` gives the router's totals.

A sibling that does not answer within ``SIBLING_TIMEOUT_SECONDS`` (being
replaced) is left out of that scrape. All of this runs per scrape, never on
the request path.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

log = logging.getLogger(__name__)

SIBLING_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class WorkerSpec:
    """Which worker a process is, of how many, and where the workers' sockets live."""

    index: int
    count: int
    socket_dir: str

    def socket(self, index: int) -> str:
        return os.path.join(self.socket_dir, f"w{index}.sock")


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(texts: dict[int, str]) -> bytes:
    """One exposition from several workers' own, every sample labelled with its worker."""
    families: dict[str, Metric] = {}
    for worker, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            if family.type == "unknown" and family.name.endswith("_created"):
                continue
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
            for s in family.samples:
                labels = {**s.labels, "worker": str(worker)}
                merged.samples.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
    return generate_latest(_Families(families.values()))


async def all_workers(spec: WorkerSpec, own: bytes) -> bytes:
    texts = {spec.index: own.decode()}
    siblings = [i for i in range(spec.count) if i != spec.index]
    answers = await asyncio.gather(*(_fetch(spec.socket(i)) for i in siblings), return_exceptions=True)
    for index, answer in zip(siblings, answers, strict=True):
        if isinstance(answer, BaseException):
            log.debug("worker %d's metrics were not read: %s", index, answer)
        else:
            texts[index] = answer
    return merge(texts)


async def _fetch(path: str) -> str:
    timeout = aiohttp.ClientTimeout(total=SIBLING_TIMEOUT_SECONDS)
    connector = aiohttp.UnixConnector(path=path)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        session.get("http://worker/metrics", params={"scope": "worker"}) as resp,
    ):
        resp.raise_for_status()
        return await resp.text()
