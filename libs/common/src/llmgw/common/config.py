"""Configuration files: YAML documents validated by pydantic models.

Each role declares its own schema (a subclass of :class:`Document`) next to
its entry point; this module only knows how to read one and how to say what
is wrong with it. Our own documents forbid unknown keys, so a typo is an
error that names the key instead of a setting silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InvalidArgument

D = TypeVar("D", bound="Document")


class Document(BaseModel):
    """Base for llmgw configuration documents: strict, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class EtcdSettings(Document):
    endpoints: list[str] = Field(
        default_factory=lambda: ["127.0.0.1:2379"],
        description="etcd client endpoints as host:port",
    )
    prefix: str = Field(default="/llmgw", description="key prefix; the cluster name is appended")
    timeout_seconds: float = Field(default=5.0, gt=0, description="per-call deadline")


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: {err.error_count()} problem(s):"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


def parse_config(data: object, model: type[D], source: str = "config") -> D:
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as err:
        raise InvalidArgument(format_validation_error(err, source)) from None


def load_config(path: str | Path, model: type[D]) -> D:
    """Read and validate a YAML configuration file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise InvalidArgument(f"cannot read config {p}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InvalidArgument(f"{p} is not valid YAML: {err}") from None
    return parse_config(data, model, str(p))


def split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgument(f"address {address!r} must be host:port")
    return host.strip("[]") or "0.0.0.0", int(port)
