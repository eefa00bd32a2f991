"""Models added at runtime: stored in etcd, merged with the declared ones.

``models/<name>`` holds one model document (JSON of a
:class:`~llmgw.control.spec.model.ModelSpec`); ``models-version`` is a guard key that every
change rewrites. The catalog in force is the declared models (the cluster
settings' ``models``, see settings) plus the stored ones.

Decisions:

- Declared models win every conflict. Adding, changing or removing a model
  whose name (or any alias) a declared model uses is refused with a message
  that says to edit the cluster settings instead; a stored model that collides with a
  declared one, or that no longer validates (a newer control plane wrote a
  field this one does not know, say), is skipped at load with a warning,
  never a reason to stop.
- A change is validated by building the whole next catalog before anything
  is written. The write is one transaction guarded by the revision of
  ``models-version`` that the change was built from, so two operators
  changing the catalog at once cannot silently overwrite each other: the
  second gets ABORTED and retries against the new state.
- A change that adds a model or changes how it runs (weights, profiles,
  adapters) first passes the load check given to the constructor
  (:class:`~llmgw.control.spec.loadcheck.LoadCheck` in production): weights
  that cannot run, or an adapter that does not exist, are refused before
  the transaction, so etcd is unchanged. What it could not check is logged.
- Any control plane accepts changes (they are etcd writes, not placement);
  every control plane watches ``models/`` and puts the new catalog in
  force within a watch round trip, the leader's reconciler included.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from llmgw.common.config import format_validation_error
from llmgw.common.errors import Conflict, FailedPrecondition, InvalidArgument, NotFound, excerpt
from llmgw.common.etcd import Compacted, Delete, Entry, ModRevisionIs, Put, Store

from ..spec.catalog import Catalog, Model
from ..spec.model import ModelSpec

log = logging.getLogger("llmgw.control.store.models")

PREFIX = "models/"
VERSION_KEY = "models-version"
# A model document larger than this is refused (etcd's default request limit is 1.5 MiB).
MAX_DOCUMENT_BYTES = 64 * 1024


# The load check: notes on what it could not check; raises when the model cannot run.
Check = Callable[[ModelSpec, ModelSpec | None], list[str]]


@dataclass(frozen=True)
class Loaded:
    catalog: Catalog
    # Revision of models-version the catalog was built from (0: never written).
    version: int
    # Store revision of the read; watch from revision + 1.
    revision: int
    skipped: tuple[str, ...] = ()


def parse_document(text: str | bytes, source: str) -> ModelSpec:
    """A model document from JSON or YAML text, with errors that name the field."""
    import yaml

    if len(text) > MAX_DOCUMENT_BYTES:
        raise InvalidArgument(
            f"{source}: the model document is {len(text)} bytes; the limit is {MAX_DOCUMENT_BYTES}"
        )
    try:
        # Stored documents are JSON: its parser is some fifty times faster than
        # PyYAML's, which matters when every change re-reads every stored model.
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise InvalidArgument(f"{source}: not valid JSON or YAML: {err}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"{source}: a model document is a mapping (name, profiles, ...)")
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as err:
        raise InvalidArgument(format_validation_error(err, source)) from None


def encode(spec: ModelSpec) -> bytes:
    return json.dumps(spec.model_dump(mode="json", exclude_defaults=True), sort_keys=True).encode()


class RuntimeModels:
    """Reads, changes and follows the stored models; merges them with the declared ones."""

    def __init__(
        self,
        store: Store,
        declared: Sequence[ModelSpec],
        check: Check | None = None,
        peers: frozenset[str] = frozenset(),
    ):
        self._store = store
        self._check = check
        self.declare(declared, peers)

    def declare(self, declared: Sequence[ModelSpec], peers: frozenset[str] = frozenset()) -> None:
        """Another set of declared models and peers (the cluster settings changed); the next load uses it.

        The peers' names are what a fallback ``PEER/MODEL`` is checked against.
        """
        self._peers = peers
        self._declared = tuple(declared)
        self._declared_names = {n for s in declared for n in (s.name, *s.aliases)}

    # -- reading ------------------------------------------------------------------

    async def load(self) -> Loaded:
        result = await self._store.range(PREFIX)
        version = await self._store.get(VERSION_KEY)
        return self._build(result.entries, version.mod_revision if version else 0, result.revision)

    def _build(self, entries: Sequence[Entry], version: int, revision: int) -> Loaded:
        models = [Model.from_spec(s, "declared") for s in self._declared]
        taken = set(self._declared_names)
        skipped: list[str] = []
        for e in sorted(entries, key=lambda e: e.key):
            name = e.key.removeprefix(PREFIX)
            try:
                spec = parse_document(e.value, f"stored model {name!r}")
            except InvalidArgument as err:
                skipped.append(f"{name}: {err}")
                continue
            clash = taken.intersection((spec.name, *spec.aliases))
            if clash:
                skipped.append(f"{name}: name(s) {sorted(clash)} are used by another model")
                continue
            models.append(Model.from_spec(spec, "runtime"))
            taken.update((spec.name, *spec.aliases))
        # References (fallbacks, canaries) may point at any stored model, so
        # they are checked on the whole set: when it fails, stored models are
        # set aside from the last until it builds, then each is tried back.
        aside: list[Model] = []
        while True:
            try:
                catalog = Catalog(models, peers=self._peers)
                break
            except InvalidArgument:
                runtime = [m for m in models if m.origin == "runtime"]
                if not runtime:
                    raise
                aside.insert(0, runtime[-1])
                models = [m for m in models if m is not runtime[-1]]
        for m in aside:
            try:
                catalog = Catalog([*models, m], peers=self._peers)
                models.append(m)
            except InvalidArgument as err:
                skipped.append(f"{m.name}: {err}")
        for s in skipped:
            log.warning("stored model skipped: %s", s)
        return Loaded(catalog, version, revision, tuple(skipped))

    # -- changing -----------------------------------------------------------------

    async def revision(self, name: str) -> int:
        """The etcd revision of a stored model's document (0: not stored)."""
        entry = await self._store.get(PREFIX + name)
        return entry.mod_revision if entry else 0

    async def put(self, spec: ModelSpec, *, replace: bool, if_revision: int = 0) -> Catalog:
        """Add (or, with ``replace``, change) a runtime model; returns the catalog it makes.

        ``if_revision``: the document's revision the change was made from; a
        model changed since is a Conflict, not overwritten.
        """
        self._refuse_declared(spec.name, (spec.name, *spec.aliases), "add or change")
        current = await self.load()
        existing = current.catalog.get(spec.name)
        if existing is not None and not replace:
            raise FailedPrecondition(
                f"model {spec.name!r} already exists; use update (or --replace) to change it"
            )
        if existing is None and replace:
            raise NotFound(f"model {spec.name!r} is not in the catalog; add it first")
        others = [m for m in current.catalog if m.name != spec.name]
        catalog = Catalog([*others, Model.from_spec(spec, "runtime")], peers=self._peers)
        if self._check is not None:
            previous = existing.spec if existing is not None else None
            for note in await asyncio.to_thread(self._check, spec, previous):
                log.warning("model %s: load check: %s", spec.name, note)
        entry = await self._store.get(PREFIX + spec.name)
        if if_revision and (entry.mod_revision if entry else 0) != if_revision:
            raise Conflict(
                f"model {spec.name!r} changed since it was read (revision {if_revision}); "
                "read it again and retry"
            )
        await self._commit(
            current.version,
            ModRevisionIs(PREFIX + spec.name, entry.mod_revision if entry else 0),
            Put(PREFIX + spec.name, encode(spec)),
        )
        return catalog

    async def remove(self, name: str) -> Catalog:
        self._refuse_declared(name, (name,), "remove")
        current = await self.load()
        model = current.catalog.resolve(name)
        if model is None:
            known = ", ".join(current.catalog.names) or "none"
            raise NotFound(f"model {excerpt(name)} is not in the catalog (known: {known})")
        if model.name != name:
            raise InvalidArgument(
                f"{excerpt(name)} is an alias of {model.name!r}; remove the model by its name"
            )
        catalog = Catalog([m for m in current.catalog if m.name != name], peers=self._peers)
        entry = await self._store.get(PREFIX + name)
        if entry is None:
            raise NotFound(f"model {excerpt(name)} is not stored in etcd")
        await self._commit(
            current.version, ModRevisionIs(PREFIX + name, entry.mod_revision), Delete(PREFIX + name)
        )
        return catalog

    def _refuse_declared(self, name: str, names: Sequence[str], verb: str) -> None:
        clash = sorted(self._declared_names.intersection(names))
        if clash:
            raise FailedPrecondition(
                f"cannot {verb} {name!r}: {', '.join(map(repr, clash))} belongs to a model declared in the "
                "cluster settings (under models); change it there instead: `llmgw settings edit`"
            )

    async def _commit(self, version: int, guard: ModRevisionIs, op: Put | Delete) -> None:
        result = await self._store.commit(
            [ModRevisionIs(VERSION_KEY, version), guard], [op, Put(VERSION_KEY, b"")]
        )
        if not result.succeeded:
            raise Conflict("the catalog changed while this change was being validated; retry it")

    # -- following ----------------------------------------------------------------

    async def follow(self, apply: Callable[[Catalog], None], retry_seconds: float = 1.0) -> None:
        """Call ``apply`` with each new catalog, for ever (cancel to stop)."""
        last: Catalog | None = None
        while True:
            try:
                loaded = await self.load()
                if last is None or _fingerprint(loaded.catalog) != _fingerprint(last):
                    apply(loaded.catalog)
                last = loaded.catalog
                async for _ in self._store.watch(PREFIX, loaded.revision + 1):
                    loaded = await self.load()
                    if _fingerprint(loaded.catalog) != _fingerprint(last):
                        apply(loaded.catalog)
                    last = loaded.catalog
            except asyncio.CancelledError:
                raise
            except Compacted:
                continue
            except Exception as err:  # etcd away: keep the catalog in force, try again
                log.warning("following stored models failed (%s); retrying", err)
                await asyncio.sleep(retry_seconds)


def _fingerprint(catalog: Catalog) -> tuple:
    return tuple((m.name, m.origin, m.spec) for m in catalog)
