"""The node's weights cache: what engines read their model from.

A weights *source* is one of:

- ``hf://ORG/NAME[@REVISION]``: a Hugging Face hub repository, fetched by
  the agent with ``huggingface_hub`` into ``<weights_dir>/hub/ORG--NAME``
  (REVISION: a branch, tag or commit; default ``main``). The ``hf://``
  prefix is required, deliberately: a bare ``org/name`` cannot be told apart
  from a relative path, and it is passed to the engine unchanged (an engine
  may fetch it itself, outside this cache).
- an absolute path that exists on the node: used in place, never copied;
  the cache only records it (so its disk use is reported and placement can
  prefer this node), and removing it forgets the record, deleting nothing.

Every entry has a *name*: the repository id (``ORG/NAME``) for a hub source,
the path itself for a local one, or one the operator chose. One name holds
one source: asking for another source under a held name (another revision,
another path) is refused with ALREADY_EXISTS rather than silently replacing
what running engines may read.

Revisions side by side (a rolling update of a model's weights): when an
engine needs a hub source (:meth:`WeightsCache.resolve`), an entry already
holding that exact source is used whatever its name; else the source is
fetched under its repository id, or, when that name holds another revision
(the one the old replicas still read), under ``ORG/NAME@REVISION``. Each
entry of a hub source has its own directory (``hub/ORG--NAME`` for the
entry named by the repository id, ``hub/ORG--NAME@REVISION`` for any
other), so fetching a new revision never writes over the files of one in
use; the old revision is removed by the operator once nothing runs from it.

Guarantees:

- One fetch per entry at a time; concurrent requests for the same source
  share it. A fetch runs in a thread (huggingface_hub blocks) owned by a
  task of this cache; progress (bytes on disk) is sampled every
  :data:`PROGRESS_SECONDS` and told to the listener only when it changed.
- A failed fetch leaves the entry FAILED with a message that says what to
  do (the hub is unreachable from this node: give a local path, or set
  ``weights.hub_endpoint`` to a mirror); fetching again retries.
- The index (``<weights_dir>/index.json``, written atomically) survives the
  agent's restart; an entry whose files are gone is dropped on load.

The hub is reached through one seam, :class:`Hub` (huggingface_hub in
production; tests give a fake at this seam only).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Protocol

from llmgw.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Unavailable

log = logging.getLogger("llmgw.agent.weights")

HUB_PREFIX = "hf://"
PROGRESS_SECONDS = 0.5
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# A branch, tag or commit: git's ref characters, bounded.
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")


class WeightsState(Enum):
    FETCHING = "fetching"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class WeightsEntry:
    name: str
    source: str
    state: WeightsState
    path: str
    in_place: bool
    size_bytes: int = 0
    fetched_bytes: int = 0
    total_bytes: int = 0
    message: str = ""


class Hub(Protocol):
    """Where hub sources come from (huggingface_hub; a fake in tests)."""

    def total_bytes(self, repo_id: str, revision: str) -> int | None:
        """The repository's size at ``revision``, or None when unknown. May raise."""
        ...

    def download(self, repo_id: str, revision: str, into: Path) -> None:
        """Fetch every file into ``into``; blocking. Raises on any failure."""
        ...


class WeightsResolver(Protocol):
    async def resolve(self, source: str) -> str:
        """The path to give the engine for ``source`` (fetching it first); raises LlmgwError."""
        ...


async def weights_unless_stopped(
    resolver: WeightsResolver, source: str, stop: asyncio.Event, waiting: Callable[[], None]
) -> str | None:
    """``resolver.resolve(source)``, or None once ``stop`` is set first.

    ``waiting`` is called once if the weights are not there at once (a fetch
    runs), so the caller can say what it waits for. Stopping does not cancel
    the fetch itself: the cache keeps it for the next replica.
    """
    fetch = asyncio.create_task(resolver.resolve(source), name=f"weights-{source}")
    stopped = asyncio.create_task(stop.wait())
    try:
        # Weights already on the node resolve at once; only a real wait is announced.
        await asyncio.wait({fetch, stopped}, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
        if not fetch.done() and not stop.is_set():
            waiting()
            await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (fetch, stopped):
            if not t.done():
                t.cancel()
        await asyncio.wait({fetch, stopped})
    if stop.is_set():
        return None
    return fetch.result()


class WeightsListener(Protocol):
    def weights_changed(self, entry: WeightsEntry) -> None:
        """Called on every change of an entry (state or progress); must not block."""
        ...


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    revision: str


def parse_hub(source: str) -> HubRef | None:
    """``hf://org/name[@rev]`` as a HubRef; None for anything else. Raises on a malformed one."""
    if not source.startswith(HUB_PREFIX):
        return None
    rest = source[len(HUB_PREFIX) :]
    repo_id, at, revision = rest.partition("@")
    if not _REPO_ID.match(repo_id) or (at and (not _REVISION.match(revision) or ".." in revision)):
        raise InvalidArgument(
            f"weights source {source!r} is not hf://ORG/NAME[@REVISION], e.g. hf://Qwen/Qwen3-0.6B@main"
        )
    return HubRef(repo_id, revision or "main")


def hub_dir(hub: HubRef, name: str) -> str:
    """The directory under ``<weights_dir>/hub`` of the entry ``name`` holding ``hub``."""
    base = hub.repo_id.replace("/", "--")
    # Only the entry named by the repository id has the plain directory; any other entry
    # (another revision beside it) gets its own, so no fetch writes over files in use.
    return base if name == hub.repo_id else f"{base}@{hub.revision.replace('/', '--')}"


def default_name(source: str) -> str:
    hub = parse_hub(source)
    return hub.repo_id if hub else source


def cached(source: str) -> bool:
    """Whether the cache handles ``source`` (a hub reference, or an absolute path that exists)."""
    return parse_hub(source) is not None or (os.path.isabs(source) and os.path.exists(source))


def disk_usage(path: Path) -> int:
    """Bytes used by the files under ``path`` (a file or a directory), following no links."""
    if path.is_file():
        return path.stat().st_size
    # A missing path walks as empty: nothing fetched yet.
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                continue  # removed while we walked
    return total


class WeightsCache:
    """The node's weights entries; used from the event loop only."""

    def __init__(self, root: Path, hub: Hub, listener: WeightsListener, hub_label: str = "the hub"):
        self._root = root
        self._hub = hub
        self._listener = listener
        self._hub_label = hub_label
        self._entries: dict[str, WeightsEntry] = {}
        self._fetches: dict[str, asyncio.Task[None]] = {}
        self._load()

    # -- reads ------------------------------------------------------------------

    def snapshot(self) -> list[WeightsEntry]:
        return sorted(self._entries.values(), key=lambda e: e.name)

    def get(self, name: str) -> WeightsEntry | None:
        return self._entries.get(name)

    # -- requests ---------------------------------------------------------------

    def fetch(self, source: str, name: str = "") -> WeightsEntry:
        """Register or start fetching ``source`` under ``name``; returns the entry as it stands.

        Raises InvalidArgument (malformed source), NotFound (a local path that
        does not exist) or AlreadyExists (the name holds another source).
        """
        hub = parse_hub(source)
        if hub is None and not os.path.isabs(source):
            raise InvalidArgument(
                f"weights source {source!r} is neither hf://ORG/NAME[@REVISION] nor an absolute path"
            )
        name = name or default_name(source)
        current = self._entries.get(name)
        if current is not None and current.source != source:
            raise AlreadyExists(
                f"weights {name!r} on this node already hold {current.source}; remove them first "
                f"(llmgw weights remove NODE {name}) or fetch {source} under another name"
            )
        if hub is None:
            path = Path(source)
            if not path.exists():
                raise NotFound(f"weights path {source} does not exist on this node")
            entry = WeightsEntry(
                name, source, WeightsState.READY, source, in_place=True, size_bytes=disk_usage(path)
            )
            if current != entry:
                self._put(entry)
            return entry
        if current is not None and current.state is not WeightsState.FAILED:
            return current  # ready, or a fetch already runs
        target = self._root / "hub" / hub_dir(hub, name)
        entry = WeightsEntry(name, source, WeightsState.FETCHING, str(target), in_place=False)
        self._put(entry)
        self._fetches[name] = asyncio.create_task(self._fetch(entry, hub, target), name=f"fetch-{name}")
        return entry

    async def resolve(self, source: str) -> str:
        """The path an engine should read ``source`` from, fetching it first if needed.

        A source that is neither a hub reference nor an existing absolute
        path is returned unchanged (the engine's business). Raises
        Unavailable when a fetch fails, AlreadyExists when its name is taken.
        """
        if not cached(source):
            return source
        entry = self.fetch(source, self._name_for(source))
        task = self._fetches.get(entry.name)
        if task is not None:
            await asyncio.shield(task)
        kept = self._entries.get(entry.name)
        if kept is None:
            raise Unavailable(f"weights {source} were removed while an engine waited for them")
        if kept.state is not WeightsState.READY:
            raise Unavailable(kept.message)
        return kept.path

    def _name_for(self, source: str) -> str:
        """The entry an engine's ``source`` goes in (the module docstring: revisions side by side)."""
        held = next((e.name for e in self._entries.values() if e.source == source), None)
        if held is not None:
            return held
        name = default_name(source)
        current = self._entries.get(name)
        hub = parse_hub(source)
        if current is None or current.source == source or hub is None:
            return name
        return f"{hub.repo_id}@{hub.revision}"

    async def remove(self, name: str, in_use: Callable[[str], bool]) -> WeightsEntry:
        """Forget ``name`` (and delete its files unless in place); returns the entry as it was.

        ``in_use(source)`` says whether a replica on the node still runs from it.
        """
        entry = self._entries.get(name)
        if entry is None:
            held = ", ".join(sorted(self._entries)) or "none"
            raise NotFound(f"no weights named {name!r} on this node (it holds: {held})")
        if entry.state is WeightsState.FETCHING:
            raise FailedPrecondition(f"weights {name!r} are still being fetched; remove them once done")
        if in_use(entry.source):
            raise FailedPrecondition(
                f"weights {name!r} are used by a replica on this node; stop it (scale the model down) first"
            )
        del self._entries[name]
        self._save()
        if not entry.in_place:
            await asyncio.to_thread(shutil.rmtree, entry.path, True)
        log.info("weights %s removed (%s, %d bytes)", name, entry.source, entry.size_bytes)
        return entry

    async def aclose(self) -> None:
        """Cancel the fetch tasks (their threads finish on their own) and wait for them."""
        tasks = list(self._fetches.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)

    # -- one fetch ----------------------------------------------------------------

    async def _fetch(self, entry: WeightsEntry, hub: HubRef, target: Path) -> None:
        try:
            try:
                total = await asyncio.to_thread(self._hub.total_bytes, hub.repo_id, hub.revision)
                entry = self._put(replace(entry, total_bytes=total or 0))
                download = asyncio.create_task(
                    asyncio.to_thread(self._hub.download, hub.repo_id, hub.revision, target)
                )
                while not download.done():
                    await asyncio.wait({download}, timeout=PROGRESS_SECONDS)
                    done = await asyncio.to_thread(disk_usage, target)
                    if done != entry.fetched_bytes:
                        entry = self._put(replace(entry, fetched_bytes=done))
                download.result()
            except Exception as err:  # noqa: BLE001 - every failure of a fetch is reported, not raised
                message = (
                    f"cannot fetch {entry.source} from {self._hub_label}: {_describe(err)}. If this node "
                    "cannot reach the hub, put the weights on the node and give their absolute path, "
                    "or set weights.hub_endpoint in the agent config to a mirror it can reach"
                )
                log.warning("weights %s: %s", entry.name, message)
                self._put(replace(entry, state=WeightsState.FAILED, message=message))
                return
            size = await asyncio.to_thread(disk_usage, target)
            self._put(replace(entry, state=WeightsState.READY, size_bytes=size, fetched_bytes=size))
            log.info("weights %s fetched from %s: %d bytes in %s", entry.name, entry.source, size, target)
        finally:
            self._fetches.pop(entry.name, None)

    # -- state ----------------------------------------------------------------------

    def _put(self, entry: WeightsEntry) -> WeightsEntry:
        before = self._entries.get(entry.name)
        self._entries[entry.name] = entry
        if before is None or before.state != entry.state or before.source != entry.source:
            self._save()
        self._listener.weights_changed(entry)
        return entry

    @property
    def _index(self) -> Path:
        return self._root / "index.json"

    def _save(self) -> None:
        # Only what survives a restart: a fetch in flight is not resumed, so it is left out.
        kept = [
            asdict(e) | {"state": e.state.value}
            for e in self._entries.values()
            if e.state is WeightsState.READY
        ]
        self._root.mkdir(parents=True, exist_ok=True)
        tmp = self._index.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": 1, "entries": kept}, indent=1))
        os.replace(tmp, self._index)

    def _load(self) -> None:
        try:
            doc = json.loads(self._index.read_text())
            rows = doc["entries"] if doc.get("version") == 1 else []
        except (OSError, ValueError, KeyError, AttributeError):
            return
        for row in rows:
            try:
                entry = WeightsEntry(**{**row, "state": WeightsState(row["state"])})
            except (TypeError, ValueError, KeyError):
                continue
            if Path(entry.path).exists():
                self._entries[entry.name] = entry
            else:
                log.info("weights %s: %s is gone; forgetting it", entry.name, entry.path)


def _describe(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


class HuggingFaceHub:
    """:class:`Hub` through huggingface_hub, at ``endpoint`` (None: its default or $HF_ENDPOINT)."""

    def __init__(self, endpoint: str | None = None, token: str | None = None, timeout: float = 10.0):
        self._endpoint = endpoint or None
        self._token = token or None
        self._timeout = timeout

    @property
    def label(self) -> str:
        return self._endpoint or "the Hugging Face hub"

    def total_bytes(self, repo_id: str, revision: str) -> int | None:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self._endpoint, token=self._token)
        info = api.model_info(repo_id, revision=revision, files_metadata=True, timeout=self._timeout)
        sizes = [s.size for s in (info.siblings or []) if s.size is not None]
        return sum(sizes) if sizes else None

    def download(self, repo_id: str, revision: str, into: Path) -> None:
        from huggingface_hub import snapshot_download

        snapshot_download(
            repo_id,
            revision=revision,
            local_dir=into,
            endpoint=self._endpoint,
            token=self._token,
            etag_timeout=self._timeout,
        )
