"""Cluster settings: one versioned document in etcd, the same for every control plane.

What is not one machine's own (timeouts, backoffs, the declared models) is
a *cluster setting*: :data:`CLUSTER_KEYS` of the control plane's file. The
settings live in etcd as numbered versions::

    settings/versions/000000000007   {"version": 7, "author", "created_at", "reason", "document": {...}}
    settings/head                    {"version": 7}   (the guard every change compares)

Decisions:

- Versions are explicit keys, not etcd's revision history, so history and
  rollback survive compaction. A change (a rollback too) writes the next
  version and the head in one transaction guarded by the head's revision:
  two operators cannot silently overwrite each other, the second gets
  ABORTED. History only grows; a rollback is a new version whose document
  is an old one's.
- The document holds only the keys someone set; the rest take the defaults
  of the control plane that reads it, as a configuration file would.
- A document is validated (schema, and the declared models as a whole
  catalog) before it is written; an invalid one is refused and nothing is
  written. A stored version that does not load on a control plane (written
  by a newer one, say) is not applied there: it keeps what it has, and at
  start it uses the newest version that loads.
- The first control plane to start against an empty store imports its
  file's cluster keys as version 1. From then on the store is the source:
  cluster keys in a file are ignored, with a warning that names them.
- Declared models are the settings' ``models`` (imported from the file's
  ``models:`` once, like every cluster key); models added at runtime live
  under ``models/`` (see models). Declared ones win every name conflict.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from llmgw.common.config import format_validation_error
from llmgw.common.errors import Conflict, InvalidArgument, NotFound, Unavailable
from llmgw.common.etcd import Compacted, ModRevisionIs, Put, Store

from ..config import ClusterSettings, ControlConfig

log = logging.getLogger("llmgw.control.store.settings")

PREFIX = "settings/"
VERSIONS = PREFIX + "versions/"
HEAD = PREFIX + "head"
MAX_DOCUMENT_BYTES = 1024 * 1024

# The keys of control.yaml that are the cluster's, not one machine's.
CLUSTER_KEYS = tuple(ClusterSettings.model_fields)
# Read once when a control plane starts; a change makes each control plane
# restart itself gracefully (standbys at once, the leader after them).
RESTART_KEYS = frozenset({"lease_ttl_seconds", "watch_history", "heartbeat_interval_seconds"})


def parse_settings(document: object, source: str) -> ClusterSettings:
    """Validated :class:`~llmgw.control.config.ClusterSettings`; InvalidArgument names each problem."""
    if not isinstance(document, dict):
        raise InvalidArgument(f"{source}: the settings are a mapping of key: value")
    unknown = sorted(set(document) - set(CLUSTER_KEYS))
    if unknown:
        raise InvalidArgument(
            f"{source}: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a cluster setting "
            f"(the keys are: {', '.join(CLUSTER_KEYS)}); a machine's own keys stay in its file"
        )
    try:
        return ClusterSettings.model_validate(document)
    except ValidationError as err:
        raise InvalidArgument(format_validation_error(err, source)) from None


def parse_text(text: str | bytes, source: str) -> dict[str, Any]:
    """A settings document from JSON or YAML text (not yet validated)."""
    import yaml

    if len(text) > MAX_DOCUMENT_BYTES:
        raise InvalidArgument(f"{source}: {len(text)} bytes; the limit is {MAX_DOCUMENT_BYTES}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InvalidArgument(f"{source}: not valid JSON or YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument(f"{source}: the settings are a mapping of key: value")
    return data


def from_file(config: ControlConfig) -> dict[str, Any]:
    """The cluster keys a control plane's file sets, as a settings document."""
    keys = set(CLUSTER_KEYS) & config.model_fields_set
    return config.model_dump(mode="json", include=keys, exclude_defaults=False) | (
        {"models": [m.model_dump(mode="json", exclude_defaults=True) for m in config.models]}
        if "models" in keys
        else {}
    )


@dataclass(frozen=True)
class Version:
    number: int
    document: dict[str, Any]
    author: str = ""
    created_at: float = 0.0
    reason: str = ""
    # Set when the stored record is not even a version record.
    broken: str = ""

    def load(self) -> ClusterSettings:
        """This version's settings; InvalidArgument when they do not load here."""
        if self.broken:
            raise InvalidArgument(self.broken)
        return parse_settings(self.document, f"settings version {self.number}")

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": self.number,
                "author": self.author,
                "created_at": self.created_at,
                "reason": self.reason,
                "document": self.document,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, number: int, data: bytes) -> Version:
        try:
            doc = json.loads(data)
            return cls(
                number,
                dict(doc["document"]),
                str(doc.get("author", "")),
                float(doc.get("created_at", 0.0)),
                str(doc.get("reason", "")),
            )
        except (ValueError, KeyError, TypeError) as err:
            return cls(number, {}, broken=f"settings version {number} is not a settings record: {err}")


def changed_keys(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    before = before or {}
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def _key(number: int) -> str:
    return f"{VERSIONS}{number:012d}"


@dataclass
class InForce:
    """What this control plane applies, and what it could not."""

    version: int = 0
    settings: ClusterSettings | None = None
    # Newer versions that did not load here: number -> why.
    refused: dict[int, str] = field(default_factory=dict)


class SettingsStore:
    """Reads, writes and follows the settings versions. One event loop; safe to call concurrently."""

    def __init__(self, store: Store, wall: Callable[[], float]):
        self._store = store
        self._wall = wall
        self.in_force = InForce()

    # -- reading --------------------------------------------------------------

    async def head(self) -> tuple[int, int]:
        """(newest version number, the head key's mod revision); (0, 0) when none."""
        entry = await self._store.get(HEAD)
        if entry is None:
            return 0, 0
        try:
            return int(json.loads(entry.value)["version"]), entry.mod_revision
        except (ValueError, KeyError, TypeError):
            log.error("settings head holds %r, not a version; treating it as version 0", entry.value[:80])
            return 0, entry.mod_revision

    async def versions(self) -> list[Version]:
        """Every stored version, newest first."""
        result = await self._store.range(VERSIONS)
        out = []
        for e in result.entries:
            try:
                number = int(e.key.removeprefix(VERSIONS))
            except ValueError:
                continue
            out.append(Version.from_json(number, e.value))
        return sorted(out, key=lambda v: v.number, reverse=True)

    async def get(self, number: int) -> Version:
        if number <= 0:
            number, _ = await self.head()
            if number == 0:
                raise NotFound("no settings are stored yet (a control plane imports them at its first start)")
        entry = await self._store.get(_key(number))
        if entry is None:
            newest, _ = await self.head()
            raise NotFound(f"settings version {number} does not exist (versions 1 to {newest})")
        return Version.from_json(number, entry.value)

    # -- changing -------------------------------------------------------------

    async def put(self, document: dict[str, Any], *, if_version: int, author: str, reason: str) -> Version:
        """Validate ``document`` and store it as the next version (nothing is written if invalid)."""
        parse_settings(document, "the settings")
        newest, guard = await self.head()
        if if_version and if_version != newest:
            raise Conflict(
                f"the settings changed: this change was made from version {if_version}, the newest is "
                f"{newest}; re-read them and retry"
            )
        version = Version(newest + 1, document, author, self._wall(), reason)
        result = await self._store.commit(
            [ModRevisionIs(HEAD, guard)],
            [
                Put(_key(version.number), version.to_json()),
                Put(HEAD, json.dumps({"version": version.number}).encode()),
            ],
        )
        if not result.succeeded:
            raise Conflict("the settings changed while this change was being written; re-read them and retry")
        log.info("settings version %d stored by %s: %s", version.number, author, reason)
        return version

    async def rollback(self, number: int, *, if_version: int, author: str, reason: str) -> Version:
        old = await self.get(number)
        if old.number == 0:
            raise NotFound("no settings are stored yet")
        why = f"rollback to version {old.number}" + (f": {reason}" if reason else "")
        try:
            old.load()
        except InvalidArgument as err:
            raise InvalidArgument(f"version {old.number} cannot be restored: {err}") from None
        return await self.put(old.document, if_version=if_version, author=author, reason=why)

    # -- starting and following -------------------------------------------------

    async def start(self, config: ControlConfig, source: str) -> ClusterSettings:
        """Import the file's cluster keys into an empty store, else load the newest version that loads.

        Returns the settings to put in force (the file's own when no stored
        version loads here).
        """
        newest, _ = await self.head()
        if newest == 0:
            document = from_file(config)
            first = Version(1, document, f"import from {source}", self._wall(), "first start: imported")
            result = await self._store.commit(
                [ModRevisionIs(HEAD, 0)],
                [Put(_key(1), first.to_json()), Put(HEAD, json.dumps({"version": 1}).encode())],
            )
            if result.succeeded:
                log.info("cluster settings imported from %s as version 1: %s", source, sorted(document))
                settings = first.load()
                self.in_force = InForce(1, settings)
                return settings
            # Another control plane imported first: read what it wrote.
        ignored = sorted(set(CLUSTER_KEYS) & config.model_fields_set)
        if ignored:
            log.warning(
                "%s sets %s: these are cluster settings, kept in etcd; the file's values are ignored. "
                "Change them with `llmgw settings set KEY=VALUE` or `llmgw settings edit`, and remove "
                "them from the file to silence this warning",
                source,
                ", ".join(ignored),
            )
        versions = await self.versions()
        for v in versions:
            try:
                settings = v.load()
            except InvalidArgument as err:
                log.error("settings version %d does not load here; trying an older one: %s", v.number, err)
                self.in_force.refused[v.number] = str(err)
                continue
            if v.number != versions[0].number:
                log.warning("using settings version %d, the newest that loads here", v.number)
            self.in_force.version, self.in_force.settings = v.number, settings
            return settings
        log.error("no stored settings version loads here; using the file's cluster keys")
        fallback = parse_settings(from_file(config), source)
        self.in_force.settings = fallback
        return fallback

    async def follow(
        self, apply: Callable[[int, ClusterSettings], Awaitable[None]], retry_seconds: float = 1.0
    ) -> None:
        """Apply each newer version that loads, for ever (cancel to stop)."""
        while True:
            try:
                result = await self._store.range(HEAD)
                await self._catch_up(apply)
                async for _ in self._store.watch(PREFIX, result.revision + 1):
                    await self._catch_up(apply)
            except asyncio.CancelledError:
                raise
            except Compacted:
                continue
            except Unavailable as err:  # etcd away: keep the settings in force, try again
                log.warning("following the settings failed (%s); retrying", err)
                await asyncio.sleep(retry_seconds)
            except Exception:  # never a reason to stop following: log, keep what is in force, retry
                log.exception("applying the settings failed; retrying")
                await asyncio.sleep(retry_seconds)

    async def _catch_up(self, apply: Callable[[int, Any], Awaitable[None]]) -> None:
        newest, _ = await self.head()
        if newest <= self.in_force.version or newest in self.in_force.refused:
            return
        version = await self.get(newest)
        try:
            settings = version.load()
        except InvalidArgument as err:
            self.in_force.refused[newest] = str(err)
            log.error(
                "settings version %d is not applied on this control plane (version %d stays in force): %s",
                newest,
                self.in_force.version,
                err,
            )
            return
        await apply(newest, settings)
        self.in_force.version, self.in_force.settings = newest, settings
        log.info("settings version %d in force (%s: %s)", newest, version.author, version.reason)


def restart_keys(before: ClusterSettings, after: ClusterSettings) -> list[str]:
    return sorted(k for k in RESTART_KEYS if getattr(before, k) != getattr(after, k))
