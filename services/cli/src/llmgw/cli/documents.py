"""Editing YAML documents from the command line: ``KEY=VALUE`` paths and ``$EDITOR``.

Used for model documents and for the cluster settings alike. A path is dot
separated; a number indexes a list (``profiles.0.gpus=2``). A value is read
as YAML, so ``4`` is a number, ``[a, b]`` a list and ``{model: x, percent: 5}``
a mapping; quote it (``'"4"'``) for a string that looks like something else.

The server validates every result; nothing here decides what is valid.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from .connection import AdminError


def _name_first(data: Any) -> Any:
    # Stored documents are JSON with sorted keys; people look for the name first.
    if isinstance(data, dict):
        ordered = {"name": data["name"]} if "name" in data else {}
        return ordered | {k: _name_first(v) for k, v in data.items() if k != "name"}
    if isinstance(data, list):
        return [_name_first(v) for v in data]
    return data


def dump(data: Any) -> str:
    return yaml.safe_dump(_name_first(data), sort_keys=False, default_flow_style=False)


def parse_assignment(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise AdminError(f"{text!r} is not KEY=VALUE (for example scaling.max=4)")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError as err:
        raise AdminError(f"the value of {key} is not valid YAML: {err}") from None
    return key, value


def _walk(doc: Any, parts: list[str], create: bool) -> Any:
    node = doc
    for i, part in enumerate(parts):
        where = ".".join(parts[: i + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise AdminError(f"{where}: no such list item (the list has {len(node)})")
            node = node[int(part)]
        elif isinstance(node, dict):
            if part not in node:
                if not create:
                    raise AdminError(f"{where} is not set")
                node[part] = {}
            node = node[part]
        else:
            raise AdminError(f"{'.'.join(parts[:i])} is a single value, not a mapping or list")
    return node


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    parent = _walk(doc, parts[:-1], create=True)
    last = parts[-1]
    if isinstance(parent, list):
        if not last.isdigit() or int(last) >= len(parent):
            raise AdminError(f"{path}: no such list item (the list has {len(parent)})")
        parent[int(last)] = value
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise AdminError(f"{path}: its parent is a single value")


def unset_path(doc: dict[str, Any], path: str) -> None:
    parts = path.split(".")
    parent = _walk(doc, parts[:-1], create=False)
    last = parts[-1]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    elif isinstance(parent, dict) and last in parent:
        del parent[last]
    else:
        raise AdminError(f"{path} is not set")


def get_path(doc: Any, path: str) -> Any:
    return _walk(doc, path.split("."), create=False)


def edit(text: str, name: str) -> str:
    """Open ``$VISUAL``/``$EDITOR`` (default vi) on ``text``; the edited text."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name.replace("/", "_")
        path.write_text(text)
        rc = subprocess.call([*shlex.split(editor), str(path)])
        if rc != 0:
            raise AdminError(f"editor {editor!r} exited with {rc}; nothing was changed")
        return path.read_text()


def keep(text: str, name: str) -> Path:
    """Save a refused edit so the work is not lost; the path to tell the user."""
    fd, path = tempfile.mkstemp(prefix=f"llmgw-{name.replace('/', '_')}-", suffix=".yaml")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return Path(path)
