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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import InvalidArgument

D = TypeVar("D", bound="Document")


class Document(BaseModel):
    """Base for llmgw configuration documents: strict, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class EtcdTls(Document):
    """TLS to etcd; with cert_file and key_file, also the client certificate of etcd's --client-cert-auth."""

    ca_file: str = Field(
        description="PEM bundle of the CA(s) that signed the etcd members' server certificates"
    )
    cert_file: str = Field(
        default="", description="PEM client certificate (etcd --client-cert-auth); with key_file"
    )
    key_file: str = Field(default="", description="PEM private key of cert_file")

    @model_validator(mode="after")
    def _pair(self) -> EtcdTls:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together: give both or neither")
        return self


class EtcdSettings(Document):
    endpoints: list[str] = Field(
        default_factory=lambda: ["127.0.0.1:2379"],
        min_length=1,
        description="every etcd member's client address as host:port; calls fail over between them",
    )
    prefix: str = Field(default="/llmgw", description="key prefix; the cluster name is appended")
    timeout_seconds: float = Field(
        default=5.0, gt=0, description="deadline of one call, failing over between members included"
    )
    member_timeout_seconds: float = Field(
        default=1.0,
        gt=0,
        description=(
            "a member that does not answer within this long (stopped, partitioned) is left for the next "
            "listed one; a silent watch is probed after twice this"
        ),
    )
    tls: EtcdTls | None = Field(default=None, description="TLS to etcd; absent: plaintext")

    @field_validator("endpoints")
    @classmethod
    def _host_port(cls, endpoints: list[str]) -> list[str]:
        for e in endpoints:
            host, sep, port = e.rpartition(":")
            if "://" in e or not sep or not host or not port.isdigit():
                raise ValueError(f"endpoint {e!r} must be host:port, without a scheme (TLS is set under tls)")
        return endpoints


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
