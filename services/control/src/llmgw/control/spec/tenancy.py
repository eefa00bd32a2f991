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
- Request and token budgets (``requests_per_minute``, ``tokens_per_minute``)
  bound the client keys an owner path owns (a key's ``owner``), summed over
  every router: the per-key quota machinery (control api/quota.py, router
  quota.py) carries each scope's budget as one more bucket, so a request is
  admitted only while its key and every scope of its owner have room.
"""

from __future__ import annotations

from pydantic import Field

from llmgw.common.config import Document
from llmgw.common.owners import LEVELS, is_owner_path, scopes

__all__ = ["LEVELS", "Quota", "check_path", "level", "owner_path", "scopes"]


class Quota(Document):
    # Whole GPUs the scope's replicas may hold at once.
    gpus: int | None = Field(default=None, ge=0)
    # Their GPUs' total memory, in GiB.
    gpu_memory_gb: float | None = Field(default=None, ge=0)
    # Replicas, GPU or CPU-only.
    replicas: int | None = Field(default=None, ge=0)
    # Requests per minute of every client key the scope owns, across routers.
    requests_per_minute: int | None = Field(default=None, ge=0)
    # Prompt plus completion tokens per minute of those keys, across routers.
    tokens_per_minute: int | None = Field(default=None, ge=0)


def check_path(path: str) -> str:
    """A quota key: 1-3 parts (org, org/team, org/team/project), each a name."""
    if not is_owner_path(path):
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


def level(path: str) -> str:
    """``org``, ``team`` or ``project``: how reasons name a scope."""
    return LEVELS[min(path.count("/"), len(LEVELS) - 1)]
