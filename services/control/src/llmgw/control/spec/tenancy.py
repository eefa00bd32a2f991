"""Tenancy: owners as a tree (org / team / project) and the quotas operators set on it.

A model's ``owner: {org, team, project}`` names one node of the tree; its
*path* is the set parts joined by ``/`` (``acme``, ``acme/search``,
``acme/search/qa``). A path's *scopes* are the path and its ancestors, org
first: a replica counts against each of them, and a quota on any of them
can refuse it.

Quotas are a cluster setting (``quotas:`` in :class:`~llmgw.control.config.ClusterSettings`),
keyed by path: ``{acme: {gpus: 16}, acme/search: {gpus: 4, replicas: 8}}``.
A limit left out is not limited; a path with no quota is limited only by
its ancestors'. Decisions:

- Keyed by path, not by a nested document: one line per level, and a
  quota on a team is set without restating its org's.
- GPU memory counts the whole memory of each GPU a replica takes (GPUs are
  given whole, see placement), not the profile's minimum: that is what the
  replica keeps from everyone else.
- A model with no owner (no ``org``) belongs to no scope and no quota
  limits it.
"""

from __future__ import annotations

import re

from pydantic import Field

from llmgw.common.config import Document

LEVELS = ("org", "team", "project")
PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Quota(Document):
    # Whole GPUs the scope's replicas may hold at once.
    gpus: int | None = Field(default=None, ge=0)
    # Their GPUs' total memory, in GiB.
    gpu_memory_gb: float | None = Field(default=None, ge=0)
    # Replicas, GPU or CPU-only.
    replicas: int | None = Field(default=None, ge=0)


def check_path(path: str) -> str:
    """A quota key: 1-3 parts (org, org/team, org/team/project), each a name."""
    parts = path.split("/")
    if len(parts) > len(LEVELS) or not all(PART.match(p) for p in parts):
        raise ValueError(
            f"quota key {path!r} is not an owner path: org, org/team or org/team/project, each part "
            "1-128 letters, digits and '._-' starting with a letter or digit"
        )
    return path


def owner_path(org: str, team: str = "", project: str = "") -> str:
    """The path of an owner: its set parts, org first, stopping at the first empty one."""
    out = []
    for part in (org, team, project):
        if not part:
            break
        out.append(part)
    return "/".join(out)


def scopes(path: str) -> list[str]:
    """``a/b/c`` -> ``[a, a/b, a/b/c]``: every scope a replica of that owner counts against."""
    if not path:
        return []
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def level(path: str) -> str:
    """``org``, ``team`` or ``project``: how reasons name a scope."""
    return LEVELS[min(path.count("/"), len(LEVELS) - 1)]
