"""Federation, as operators declare it: the peer clusters whose models this cluster offers.

Example (cluster settings, ``federation``)::

    federation:
      check_interval_seconds: 10
      hop_limit: 1
      peers:
        - name: west
          url: "https://llm.west.example.com"     # the peer's router, without /v1
          api_key_file: /etc/llmgw/peers/west.key  # a client API key of the peer's
          models: all                               # or a list: [llama-70b, qwen-32b]
          send_tags: true                           # the peer asks for x-llmgw-origin-cluster

A peer's model ``M`` is offered here as ``west/M`` while the peer answers its
checks and lists ``M`` (see :mod:`llmgw.control.leader.federation`).

Decisions:

- **A peer is its router, reached like an external provider.** What this
  cluster needs of a peer is what an OpenAI client needs of any gateway: a
  URL and a key. Nothing of the peer's etcd, control plane or replicas is
  shared, so a peer can be upgraded, moved or lost without this cluster
  noticing more than a failed check.
- **Names are ``PEER/MODEL``,** so a peer's model can never take a local
  name by accident; a local model that happens to have such a name (Hugging
  Face ids look just like that) wins, and the clash is reported.
- **A fallback may name a peer's model before the peer offers it** (the
  catalog accepts ``PEER/...`` for a declared peer): it answers while the
  peer does, and is skipped while it does not, instead of making the
  whole catalog invalid whenever a peer is down.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmgw.common.config import Document
from llmgw.common.errors import excerpt

from .model import NAME_PATTERN

PEER_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
_MODEL_NAME = re.compile(NAME_PATTERN)


class Peer(Document):
    # The peer's name here: its models are offered as NAME/MODEL.
    name: str = Field(pattern=PEER_NAME_PATTERN, description="peer name: lowercase letters, digits, '-'")
    # Base URL of the peer's router (its OpenAI API without /v1).
    url: str = Field(max_length=1024, description="the peer router's base URL, without /v1")
    # A client API key of the peer's (`llmgw keys create` there), one line in a
    # file on every control plane (health checks) and router (requests) here.
    api_key_file: str = Field(default="", max_length=1024, description="file holding the peer's client key")
    # The peer's models to offer: "all" it lists, or these names.
    models: Literal["all"] | list[str] = Field(default="all", description='"all", or a list of model names')
    # The peer asks for tags: requests sent to it carry x-llmgw-origin-cluster.
    send_tags: bool = False

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not re.match(r"^https?://[^\s/]+$", v.rstrip("/")):
            raise ValueError(f"peer url {excerpt(v)} must be http:// or https:// and a host, with no path")
        return v.rstrip("/")

    @field_validator("models")
    @classmethod
    def _names(cls, v: Literal["all"] | list[str]) -> Literal["all"] | list[str]:
        if isinstance(v, list):
            if not v:
                raise ValueError('models lists no model; give "all" or at least one name')
            if len(v) > 1000:
                raise ValueError("models lists more than 1000 names")
            for name in v:
                if not _MODEL_NAME.match(name):
                    raise ValueError(f"{excerpt(name)} is not a valid model name")
            if len(set(v)) != len(v):
                raise ValueError(f"models {v} lists a name twice")
        return v

    def offers(self, name: str) -> bool:
        """Whether the settings ask for the peer's model ``name``."""
        return self.models == "all" or name in self.models


class Federation(Document):
    # How often each peer's /v1/models is checked (every control plane checks;
    # the leader publishes). A peer that fails a check, or stops listing a model,
    # leaves every router's table within about a second of that check.
    check_interval_seconds: float = Field(default=10.0, ge=0.2, le=3600)
    # The longest one check may take (capped at the interval).
    check_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    # Cluster boundaries a request may have crossed before this cluster still
    # forwards it to a peer: 1 forwards only requests from clients, never one
    # that came from a peer, so a request cannot loop between clusters.
    hop_limit: int = Field(default=1, ge=1, le=8)
    # The peer clusters (name, router URL, key file, models, send_tags).
    peers: list[Peer] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _unique(self) -> Federation:
        names = [p.name for p in self.peers]
        if len(set(names)) != len(names):
            raise ValueError(f"peer names {names} repeat")
        return self

    @property
    def names(self) -> frozenset[str]:
        return frozenset(p.name for p in self.peers)

    @property
    def timeout_seconds(self) -> float:
        return min(self.check_timeout_seconds, self.check_interval_seconds)


def peer_of(name: str, peers: frozenset[str]) -> str:
    """The declared peer whose model ``name`` would be (``PEER/MODEL``), or ''."""
    head, sep, rest = name.partition("/")
    return head if sep and rest and head in peers else ""
