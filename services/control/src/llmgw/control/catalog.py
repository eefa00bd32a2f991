"""The catalog: the models this cluster serves, validated once, looked up by name or alias.

Built from the configuration's ``models`` (the schema already refuses
duplicate names and aliases; the constructor checks again so a catalog built
any other way cannot be ambiguous either). Immutable: a different catalog is
a different object, so a reconcile pass that holds one sees one consistent
set of models from start to end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from llmgw.common.errors import InvalidArgument

from .config import ModelSpec


@dataclass(frozen=True)
class Model:
    name: str
    engine: str
    gpus: int
    min_replicas: int
    aliases: tuple[str, ...] = ()
    args: Mapping[str, str] = field(default_factory=dict)
    owned_by: str = "llmgw"

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> Model:
        return cls(
            name=spec.name,
            engine=spec.profile.engine,
            gpus=spec.profile.gpus,
            min_replicas=spec.min_replicas,
            aliases=tuple(spec.aliases),
            args=MappingProxyType(dict(spec.profile.args)),
            owned_by=spec.owned_by,
        )

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


class Catalog:
    """An immutable set of models; every name and alias resolves to exactly one."""

    def __init__(self, models: Iterable[Model] = ()):
        by_name: dict[str, Model] = {}
        by_any: dict[str, Model] = {}
        for m in models:
            for n in m.names:
                if n in by_any:
                    raise InvalidArgument(
                        f"model name or alias {n!r} is used by both {by_any[n].name!r} and "
                        f"{m.name!r}; names and aliases must be unique across models"
                    )
                by_any[n] = m
            by_name[m.name] = m
        self._by_name = dict(sorted(by_name.items()))
        self._by_any = by_any

    @classmethod
    def from_specs(cls, specs: Sequence[ModelSpec]) -> Catalog:
        return cls(Model.from_spec(s) for s in specs)

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
