"""The catalog: the models this cluster serves, validated once, looked up by name or alias.

:class:`Catalog` is the only way to get one, and its constructor checks the
whole set: every name, alias and adapter name resolves to exactly one model,
fallbacks and canary candidates exist (by name or alias), no model falls
back to itself through any chain. Every problem is reported at once, each
saying what to fix, so an operator fixes a file in one go.

Immutable: a different catalog is a different object, so a reconcile pass
that holds one sees one consistent set of models from start to end.

A :class:`Model` carries its whole :class:`~llmgw.control.spec.model.ModelSpec` plus the
fields placement reads on every pass, precomputed: its profiles as
:class:`Needs` in priority order (bytes, not GB; a plain selector mapping),
its capacity class, and for display the first profile's engine, GPUs and
args; and where it came from: ``declared`` (the control plane's file),
``runtime`` (added through the admin API, stored in etcd) or ``peer`` (a
peer cluster's, offered while the peer answers; see spec.federation).

A catalog knows the declared peers' names: a fallback may name ``PEER/MODEL``
of a declared peer whether or not the peer offers that model now (it
answers while the peer does; routers skip a fallback that is not in their
table).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from packaging.specifiers import SpecifierSet

from llmgw.common.errors import InvalidArgument

from .builds import parse_range
from .federation import peer_of
from .model import ModelSpec, Profile
from .tenancy import owner_path

Origin = Literal["declared", "runtime", "peer"]
# Evicts and is evicted: see reconcile's preemption rule.
CLASS_RANK = {"critical": 0, "standard": 1, "opportunistic": 2}
GB = 1024**3


@dataclass(frozen=True)
class Needs:
    """What one replica of one profile takes from a node: what placement fits."""

    index: int
    engine: str
    gpus: int
    # Free memory needed on each GPU it takes (0: any).
    gpu_memory_bytes: int = 0
    memory_bytes: int = 0
    cpu_cores: float = 0.0
    node_selector: Mapping[str, str] = field(default_factory=dict)
    args: Mapping[str, str] = field(default_factory=dict)
    # The engine versions allowed (spec.builds); None: any build of the engine.
    versions: SpecifierSet | None = None

    @classmethod
    def from_profile(cls, index: int, p: Profile) -> Needs:
        return cls(
            index=index,
            engine=p.engine,
            gpus=p.gpus,
            gpu_memory_bytes=int(p.gpu_memory_gb * GB),
            memory_bytes=int(p.memory_gb * GB),
            cpu_cores=float(p.cpu_cores),
            node_selector=MappingProxyType(dict(p.node_selector)),
            args=MappingProxyType(dict(p.args)),
            versions=parse_range(p.engine_version) if p.engine_version else None,
        )

    def describe(self) -> str:
        """``vllm, 2 GPUs x 40 GiB, 16 GiB, 8 cores, zone=a``: how explanations name it."""
        parts = [self.engine + (str(self.versions) if self.versions is not None else "")]
        if self.gpus:
            gpus = f"{self.gpus} GPU{'' if self.gpus == 1 else 's'}"
            if self.gpu_memory_bytes:
                gpus += f" x {_gib(self.gpu_memory_bytes)}"
            parts.append(gpus)
        else:
            parts.append("CPU only")
        if self.memory_bytes:
            parts.append(f"{_gib(self.memory_bytes)} host memory")
        if self.cpu_cores:
            parts.append(f"{self.cpu_cores:g} cores")
        parts.extend(f"{k}={v}" for k, v in sorted(self.node_selector.items()))
        return ", ".join(parts)


# Engine args the agent's comfyui launcher turns into ComfyUI's extra_model_paths.yaml
# (llmgw.agent.engines.ComfyUILauncher): folders, comma-separated.
CHECKPOINTS_ARG = "checkpoints"
CUSTOM_NODES_ARG = "custom-nodes"


def comfy_args(spec: ModelSpec) -> dict[str, str]:
    """The folders a ComfyUI model's engine needs: its checkpoint's and its custom nodes'."""
    if spec.comfyui is None or spec.external is not None:
        return {}
    source = spec.weights.source.rstrip("/")
    head, _, base = source.rpartition("/")
    folder = (head or "/") if base == spec.comfy_checkpoint else source
    args = {CHECKPOINTS_ARG: folder}
    if spec.comfyui.custom_nodes:
        args[CUSTOM_NODES_ARG] = ",".join(spec.comfyui.custom_nodes)
    return args


# The engine arg the agent resolves through its weights cache and gives the engine as its
# model (llmgw.agent.engines); ``model`` is vLLM's spelling of the same, taken when set.
WEIGHTS_ARG = "weights"
REVISION_ARG = "revision"
HUB_PREFIX = "hf://"


def weights_args(spec: ModelSpec, profile_args: Mapping[str, str]) -> dict[str, str]:
    """The args that make a replica load the model document's weights (``weights.source`` at
    ``weights.revision``), overlaid on ``profile_args``; empty when there is nothing to add.

    - A profile's own ``weights`` or ``model`` arg wins (a profile may need another format of
      the same model, a GGUF file for llama.cpp); the revision still pins it when it is an
      unpinned ``hf://`` source.
    - ``hf://ORG/NAME`` with a revision becomes ``hf://ORG/NAME@REVISION``: the agent fetches
      exactly that into its weights cache and starts the engine on the local copy.
    - An absolute path is the engine's as it is (the revision is only a label then: change
      the path to change the weights).
    - Anything else (a bare hub id the engine fetches itself) goes as it is, with the
      revision as the engine's ``--revision`` unless the profile sets one.

    A ComfyUI model's weights go as its checkpoint folder instead (:func:`comfy_args`).
    """
    if spec.comfyui is not None or spec.external is not None:
        return {}
    revision = spec.weights.revision
    own = WEIGHTS_ARG if WEIGHTS_ARG in profile_args else "model" if "model" in profile_args else ""
    source = profile_args[own] if own else spec.weights.source
    if not source:
        return {}
    name = own or WEIGHTS_ARG
    if source.startswith(HUB_PREFIX):
        if revision and "@" not in source:
            return {name: f"{source}@{revision}"}
        return {} if own else {name: source}
    out = {} if own else {name: source}
    if revision and not source.startswith("/") and REVISION_ARG not in profile_args:
        out[REVISION_ARG] = revision
    return out


def _gib(n: int) -> str:
    return f"{n / GB:.3g} GiB"


@dataclass(frozen=True)
class PeerLink:
    """How a peer cluster's model is reached: which peer, and what requests to it carry."""

    peer: str
    # This cluster's name, sent as the origin tag; empty: the peer asked for no tags.
    origin_cluster: str
    hop_limit: int


@dataclass(frozen=True)
class Model:
    name: str
    engine: str
    gpus: int
    min_replicas: int
    aliases: tuple[str, ...] = ()
    args: Mapping[str, str] = field(default_factory=dict)
    owned_by: str = "llmgw"
    max_replicas: int = 0
    fallbacks: tuple[str, ...] = ()
    origin: Origin = "declared"
    spec: ModelSpec | None = None
    # Profiles in priority order; default: one made of engine, gpus and args.
    profiles: tuple[Needs, ...] = ()
    capacity_class: str = "standard"
    # The owner's path in the tenancy tree ("acme/search"; "" owned by no one): its quotas apply.
    owner: str = ""
    # A member of a shared ComfyUI environment: the hidden model whose replicas serve it
    # (it has none of its own; its demand counts as that model's). See spec.environments.
    served_by: str = ""
    # A shared environment's entry (comfyui-env-NAME): routed to only through its members' names.
    hidden: bool = False
    # For a shared environment's entry: its members' names.
    members: tuple[str, ...] = ()
    # Set for a peer cluster's model (origin "peer").
    peer: PeerLink | None = None
    # ModelSpec.version: replicas recorded with another one are replaced (decide.rollout).
    version: str = ""

    def __post_init__(self) -> None:
        if not self.profiles and self.engine != "external":
            object.__setattr__(self, "profiles", (Needs(0, self.engine, self.gpus, args=self.args),))

    @property
    def rank(self) -> int:
        """Placement order of its class: critical (0) first, opportunistic (2) last."""
        return CLASS_RANK.get(self.capacity_class, 1)

    @classmethod
    def from_spec(cls, spec: ModelSpec, origin: Origin = "declared") -> Model:
        first = spec.profiles[0] if spec.profiles else None
        return cls(
            name=spec.name,
            engine=first.engine if first else "external",
            gpus=first.gpus if first else 0,
            # An external model runs nothing here.
            min_replicas=spec.scaling.min if first else 0,
            max_replicas=spec.scaling.upper if first else 0,
            aliases=tuple(spec.aliases),
            args=MappingProxyType(dict(first.args) if first else {}),
            owned_by=spec.display_owner,
            fallbacks=tuple(spec.fallbacks),
            origin=origin,
            spec=spec,
            profiles=tuple(
                replace(
                    n, args=MappingProxyType({**n.args, **weights_args(spec, n.args), **comfy_args(spec)})
                )
                for n in (Needs.from_profile(i, p) for i, p in enumerate(spec.profiles))
            ),
            capacity_class=spec.capacity_class,
            owner=owner_path(spec.owner.org, spec.owner.team, spec.owner.project),
            version=spec.version,
        )

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a client may use for this model."""
        adapters = tuple(a.name for a in self.spec.adapters) if self.spec else ()
        return (self.name, *self.aliases, *adapters)

    @property
    def external(self) -> bool:
        return self.spec is not None and self.spec.external is not None


class Catalog:
    """An immutable set of models; every name and alias resolves to exactly one."""

    def __init__(self, models: Iterable[Model] = (), *, peers: frozenset[str] = frozenset()):
        self.peers = peers
        problems: list[str] = []
        by_name: dict[str, Model] = {}
        by_any: dict[str, Model] = {}
        # Deferred: environments builds Models, so it imports this module.
        from .environments import with_environments

        models, shared_problems = with_environments(list(models))
        problems += shared_problems
        for m in models:
            for n in m.names:
                other = by_any.get(n)
                if other is not None:
                    problems.append(
                        f"name {n!r} is used by both {other.name!r} and {m.name!r}; "
                        "names, aliases and adapter names must be unique across models"
                    )
                    continue
                by_any[n] = m
            by_name.setdefault(m.name, m)
        self._by_name = dict(sorted(by_name.items()))
        self._by_any = by_any
        problems += self._check_references()
        if problems:
            raise InvalidArgument(f"the catalog has {len(problems)} problem(s):\n  " + "\n  ".join(problems))

    def _check_references(self) -> list[str]:
        problems: list[str] = []
        for m in self._by_name.values():
            for f in m.fallbacks:
                target = self._by_any.get(f)
                if target is None and peer_of(f, self.peers):
                    continue  # a peer's model: answers while the peer offers it
                if target is None:
                    problems.append(f"model {m.name!r} falls back to {f!r}, which is not in the catalog")
                elif target.name == m.name:
                    problems.append(f"model {m.name!r} falls back to {f!r}, one of its own names")
            canary = m.spec.canary if m.spec else None
            if canary is not None:
                target = self._by_any.get(canary.model)
                if target is None:
                    problems.append(
                        f"model {m.name!r} has canary {canary.model!r}, which is not in the catalog"
                    )
                elif target.name == m.name:
                    problems.append(f"model {m.name!r} has canary {canary.model!r}, one of its own names")
        if not problems:
            problems += self._cycles()
        return problems

    def _cycles(self) -> list[str]:
        """Fallback chains that come back to where they started, each reported once."""
        edges = {
            m.name: [self._by_any[f].name for f in m.fallbacks if f in self._by_any]
            for m in self._by_name.values()
        }
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        found: list[str] = []

        def visit(name: str, path: list[str]) -> None:
            state[name] = 1
            path.append(name)
            for nxt in edges[name]:
                if state.get(nxt) == 1:
                    cycle = path[path.index(nxt) :] + [nxt]
                    found.append("fallbacks form a cycle: " + " -> ".join(cycle) + "; remove one of them")
                elif nxt not in state:
                    visit(nxt, path)
            path.pop()
            state[name] = 2

        for name in edges:
            if name not in state:
                visit(name, [])
        return found

    @classmethod
    def from_specs(
        cls, specs: Sequence[ModelSpec], origin: Origin = "declared", *, peers: frozenset[str] = frozenset()
    ) -> Catalog:
        return cls((Model.from_spec(s, origin) for s in specs), peers=peers)

    def replaced(self, models: Mapping[str, Model]) -> Catalog:
        """This catalog with some models swapped for others of the same name (a rollback)."""
        return Catalog(models.get(m.name, m) for m in self)

    def get(self, name: str) -> Model | None:
        """The model with this exact name (not an alias)."""
        return self._by_name.get(name)

    def resolve(self, name_or_alias: str) -> Model | None:
        return self._by_any.get(name_or_alias)

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def __iter__(self) -> Iterator[Model]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name


def with_federated(base: Catalog, federated: Iterable[Model]) -> tuple[Catalog, list[str]]:
    """``base`` plus the peers' models whose names it leaves free; and the names it did not.

    A local model always wins: a peer's ``PEER/MODEL`` that a local name or
    alias already takes is left out and returned, for the operator to see
    (``llmgw peers``), never resolved by renaming either side.
    """
    added: list[Model] = []
    clashes: list[str] = []
    seen: set[str] = set()
    for m in federated:
        if base.resolve(m.name) is not None:
            clashes.append(m.name)
        elif m.name not in seen:
            seen.add(m.name)
            added.append(m)
    if not added:
        return base, clashes
    return Catalog([*base, *added], peers=base.peers), clashes
