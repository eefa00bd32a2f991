"""Owner paths, shared by the control plane (quotas, placement) and the router (budgets per owner).

An owner is a path in a tree: ``org``, ``org/team`` or ``org/team/project``,
each part a name. Its *scopes* are the path and its ancestors, org first: a
replica, a request or a token counts against each of them. The control
plane's ``spec.tenancy`` says how models and quotas use them; a client
key's ``owner`` is an owner path when it reads as one (otherwise free text
that belongs to no scope), and its requests then also spend its owner's
budgets, whose shares travel in QuotaService under ``owner:<path>`` ids.
"""

from __future__ import annotations

import re

LEVELS = ("org", "team", "project")
PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# The id an owner scope's budget has among the keys' in QuotaService.
BUDGET_PREFIX = "owner:"


def is_owner_path(text: str) -> bool:
    parts = text.split("/")
    return len(parts) <= len(LEVELS) and all(PART.match(p) for p in parts)


def scopes(path: str) -> list[str]:
    """``a/b/c`` -> ``[a, a/b, a/b/c]``; ``""`` -> ``[]``."""
    if not path:
        return []
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]
