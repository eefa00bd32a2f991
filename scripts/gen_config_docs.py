#!/usr/bin/env python3
"""Write docs/configuration.md from the configuration schemas themselves.

The reference is generated so it cannot drift from the code:
tests/unit/common/test_config_docs.py fails when the committed page differs
from what this script writes. Descriptions come from each field's
``description`` or, failing that, the comment-free field name; defaults are
the schema's own.

Usage: python scripts/gen_config_docs.py [--check]
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "configuration.md"

HEADER = """# Configuration reference

Every llmgw role reads one YAML file (`--config FILE`); unknown keys are
errors that name the key, so a typo never passes silently. Flags given on
the command line override the file. This page is generated from the schemas
by `python scripts/gen_config_docs.py`; a test fails when it is stale.
"""


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        # "or", not "|": a pipe would end the table cell even inside backticks.
        return " or ".join("None" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is None:
        return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")
    args = ", ".join(_type_name(a) for a in typing.get_args(tp))
    name = getattr(origin, "__name__", str(origin))
    return f"{name}[{args}]"


def _default(field) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(see below)"
    else:
        return "**required**"
    if field.default_factory is not None and typing.get_origin(field.annotation) is None:
        # Computed per process (host names, pids): say so instead of printing this one's.
        if isinstance(value, str) and value:
            return "(computed)"
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return f"`{text}`"


def _nested(tp) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _nested(arg)]


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The ``#`` comment lines right above each field in the source of the class or a base."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
            found |= _own_comments(cls, model)
    return found


def _own_comments(cls: type[BaseModel], model: type[BaseModel]) -> dict[str, str]:
    try:
        source = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in source:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        name = stripped.split(":", 1)[0]
        if pending and name.isidentifier() and name in model.model_fields:
            found[name] = " ".join(pending)
        pending = []
    return found


def render_model(model: type[BaseModel], title: str, seen: set) -> list[str]:
    lines = [f"### {title}", ""]
    doc = (model.__doc__ or "").strip().split("\n\n")[0]
    if doc and not doc.startswith("!!!") and "Usage docs" not in doc:
        lines += [" ".join(doc.split()), ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    children = []
    comments = _comments(model)
    for name, field in model.model_fields.items():
        desc = (field.description or comments.get(name, "")).replace("|", "\\|")
        lines.append(f"| `{name}` | `{_type_name(field.annotation)}` | {_default(field)} | {desc} |")
        for child in _nested(field.annotation):
            if child not in seen:
                seen.add(child)
                children.append((child, f"{title}.{name}"))
    lines.append("")
    for child, t in children:
        lines += render_model(child, t, seen)
    return lines


def render() -> str:
    from llmgw.agent.config import AgentConfig
    from llmgw.control.config import ControlConfig
    from llmgw.router.config import RouterConfig

    out = [HEADER]
    for role, model in [("control", ControlConfig), ("router", RouterConfig), ("agent", AgentConfig)]:
        out += [f"## {role} (`llmgw-{role} --config {role}.yaml`)", ""]
        mod_doc = sys.modules[model.__module__].__doc__ or ""
        example = mod_doc.split("::", 1)
        if len(example) == 2:
            block = [ln[4:] if ln.startswith("    ") else ln for ln in example[1].strip("\n").splitlines()]
            out += ["Example:", "", "```yaml", *[b.rstrip() for b in block], "```", ""]
        out += render_model(model, role, {model})
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is stale; run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
