"""Shared ComfyUI environments: one replica for every image model of one environment.

Two ComfyUI models on one card used to hand it to each other, each starting
ComfyUI and loading its weights from nothing. Models that name the same
``comfyui.environment`` (two or more of them) therefore get one hidden
catalog entry, ``comfyui-env-<name>``, and share its replicas:

- **Placed as the biggest member.** Its profiles are its first member's
  (in name order), each asking for the most GPU and host memory any
  member's profiles ask for, so whichever member is used, the replica
  holds it.
- **On demand, idle for the longest.** ``scaling.min`` 0, ``max`` the
  largest member's, idle timeout the longest member's: a member's idle
  timeout is a promise about how long it stays warm, and the shared
  replica keeps every member's promise. Its capacity class is the most
  critical member's.
- **Carries everything.** Its engine args name every member's checkpoint
  folder and every custom-node folder (the agent's comfyui launcher
  writes them into ComfyUI's extra_model_paths.yaml). Two members whose
  checkpoints have one file name are refused: ComfyUI finds checkpoints by
  file name, so one of them would silently load the other's weights.
- **Members have no replicas.** A member keeps its names and its document,
  but its bounds are 0..0 and it points at the entry (``served_by``):
  asking for it wakes and uses the entry's replica, which routers offer
  under every member's name with that member's workflow and checkpoint.
  Because a member places nothing, it can never evict the replica its
  sibling is using; and the autoscaler counts a member's demand (load,
  held requests, last use) as the entry's.

An environment with one model is no environment: that model runs its own
replicas as any model does. The entry's name is reserved: a model of that
name is reported as a clash by the catalog like any other.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from .catalog import CHECKPOINTS_ARG, CLASS_RANK, CUSTOM_NODES_ARG, Model, comfy_args
from .model import ModelSpec

PREFIX = "comfyui-env-"


def entry_name(environment: str) -> str:
    return PREFIX + environment


def with_environments(models: list[Model]) -> tuple[list[Model], list[str]]:
    """``models`` with each shared environment's members pointed at a new hidden entry, and problems.

    Idempotent, so a catalog rebuilt from another's models (the admin API adds
    one to the current set) derives its environments afresh: entries are
    dropped and members restored from their documents before grouping, so a
    member whose sibling left runs its own replicas again.
    """
    models = [
        Model.from_spec(m.spec, m.origin) if m.served_by and m.spec is not None else m
        for m in models
        if not m.hidden
    ]
    groups: dict[str, list[Model]] = defaultdict(list)
    for m in models:
        spec = m.spec
        if spec is not None and spec.comfyui is not None and spec.comfyui.environment and not m.external:
            groups[spec.comfyui.environment].append(m)
    shared = {env: sorted(ms, key=lambda m: m.name) for env, ms in groups.items() if len(ms) >= 2}
    if not shared:
        return models, []
    problems: list[str] = []
    out: list[Model] = []
    member_of = {m.name: env for env, ms in shared.items() for m in ms}
    for m in models:
        env = member_of.get(m.name)
        out.append(
            m if env is None else replace(m, min_replicas=0, max_replicas=0, served_by=entry_name(env))
        )
    for env, members in sorted(shared.items()):
        clash = _checkpoint_clash(members)
        if clash:
            problems.append(clash)
            continue
        out.append(_entry(env, members))
    return out, problems


def _checkpoint_clash(members: list[Model]) -> str:
    seen: dict[str, str] = {}
    for m in members:
        assert m.spec is not None
        ckpt = m.spec.comfy_checkpoint
        if ckpt in seen:
            return (
                f"models {seen[ckpt]!r} and {m.name!r} share environment "
                f"{m.spec.comfyui.environment if m.spec.comfyui else ''!r} but both load a checkpoint "
                f"named {ckpt!r}; ComfyUI finds checkpoints by file name, so rename one"
            )
        seen[ckpt] = m.name
    return ""


def _entry(env: str, members: list[Model]) -> Model:
    specs: list[ModelSpec] = [m.spec for m in members if m.spec is not None]
    first = specs[0]
    gpu_memory = max(p.gpu_memory_gb for s in specs for p in s.profiles)
    memory = max(p.memory_gb for s in specs for p in s.profiles)
    folders: list[str] = []
    nodes: list[str] = []
    for s in specs:
        args = comfy_args(s)
        folders += [f for f in args.get(CHECKPOINTS_ARG, "").split(",") if f and f not in folders]
        nodes += [n for n in args.get(CUSTOM_NODES_ARG, "").split(",") if n and n not in nodes]
    carried = {CHECKPOINTS_ARG: ",".join(folders), **({CUSTOM_NODES_ARG: ",".join(nodes)} if nodes else {})}
    profiles = [
        {
            **p.model_dump(),
            "gpu_memory_gb": gpu_memory if p.gpus else p.gpu_memory_gb,
            "memory_gb": max(p.memory_gb, memory),
        }
        for p in first.profiles
    ]
    critical = min((s.capacity_class for s in specs), key=lambda c: CLASS_RANK.get(c, 1))
    doc = {
        "name": entry_name(env),
        "profiles": profiles,
        # The first member's weights source keeps the entry's own document valid; the
        # engine gets every member's folders through the args below.
        "weights": first.weights.model_dump(),
        "scaling": {
            "min": 0,
            "max": max(s.scaling.upper for s in specs),
            "idle_timeout_seconds": max(s.scaling.idle_timeout_seconds for s in specs),
            "target_load": first.scaling.target_load,
        },
        "capacity_class": critical,
        "owner": first.owner.model_dump(),
        "apis": ["images"],
        "comfyui": {
            "workflow": first.comfyui.workflow if first.comfyui else "txt2img",
            "checkpoint": first.comfy_checkpoint,
            "environment": env,
            "custom_nodes": nodes,
        },
    }
    spec = ModelSpec.model_validate(doc)
    entry = Model.from_spec(spec, members[0].origin)
    entry = replace(
        entry,
        profiles=tuple(replace(n, args={**n.args, **carried}) for n in entry.profiles),
        hidden=True,
        members=tuple(m.name for m in members),
    )
    return entry
