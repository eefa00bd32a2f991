"""The model document: how an operator declares one model, in YAML or JSON.

The same schema is used for models declared in the control plane's file and
for models added at runtime through the admin API (stored in etcd as JSON),
so a model moves between the two without translation. What one document can
check about itself is checked here; what needs the whole catalog (unique
names, fallbacks that exist, no cycles) is :class:`~llmgw.control.spec.catalog.Catalog`'s job.

Example::

    name: llama-8b
    aliases: [llama]
    profiles:                       # tried in order: the first that fits is used
      - {engine: vllm, gpus: 1, gpu_memory_gb: 40, args: {max-model-len: "8192"}}
      - {engine: llama.cpp, cpu_only: true, memory_gb: 16, cpu_cores: 8}
    weights: {source: /models/llama-8b, revision: main}
    scaling: {min: 1, max: 4, idle_timeout_seconds: 600, target_load: 16}
    capacity_class: critical
    owner: {org: acme, team: search, project: qa}
    fallbacks: [llama-3b]
    canary: {model: llama-8b-next, percent: 5}
    apis: [chat, completions, responses, messages, tokenize]   # default: every API

An external model names a provider instead of profiles::

    name: gpt-4o
    external: {url: "https://api.openai.com", model: gpt-4o, api_key_file: /etc/llmgw/openai.key}

An image model served by ComfyUI (docs/images.md); models naming one
``environment`` share one replica (:mod:`~llmgw.control.spec.environments`)::

    name: sdxl
    profile: {engine: comfyui, gpus: 1, gpu_memory_gb: 12}
    weights: {source: /models/sdxl/sd_xl_base_1.0.safetensors}
    comfyui: {workflow: txt2img, environment: diffusion}

Shorthand, for the common one-profile case: ``profile: {...}`` means
``profiles: [{...}]`` and ``min_replicas: N`` means ``scaling: {min: N}``.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from llmgw.common.config import Document
from llmgw.common.errors import excerpt

from .builds import parse_range

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)

CapacityClass = Literal["critical", "standard", "opportunistic"]
# The APIs a model may serve (the router's table of paths, llmgw.router.apis, names the same).
ApiName = Literal[
    "chat",
    "completions",
    "embeddings",
    "responses",
    "messages",
    "audio",
    "rerank",
    "score",
    "pooling",
    "classify",
    "tokenize",
    "realtime",
    "images",
]
# Workflows the router has built in (llmgw.router.comfyui names the same); any other is a file.
BUILTIN_WORKFLOWS = ("txt2img",)
_ENVIRONMENT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def _check_name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {excerpt(value)} is not a valid model name: 1-128 characters of letters, digits and "
            "'._:/-', starting with a letter or digit"
        )
    return value


class Profile(Document):
    engine: str = Field(
        min_length=1,
        max_length=64,
        description="engine kind an agent must offer: simulator, vllm, sglang, llama.cpp, comfyui",
    )
    engine_version: str = Field(
        default="",
        max_length=128,
        description="versions of the engine this profile runs on, PEP 440 ('>=0.8,<0.9'); "
        "only nodes with a matching build are used",
    )
    gpus: int = Field(default=1, ge=0, le=64, description="GPUs per replica; default 1, or 0 with cpu_only")
    gpu_memory_gb: float = Field(default=0, ge=0, description="free memory needed on each GPU; 0: any")
    memory_gb: float = Field(default=0, ge=0, description="host memory per replica; required when cpu_only")
    cpu_cores: float = Field(default=0, ge=0, description="CPU cores per replica; 0: no requirement")
    cpu_only: bool = Field(default=False, description="runs without GPUs")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="labels a node must carry (all of them) to run this profile"
    )
    args: dict[str, str] = Field(
        default_factory=dict, description="engine flags without the leading --, name -> value"
    )

    @field_validator("engine_version")
    @classmethod
    def _version_range(cls, v: str) -> str:
        if v:
            parse_range(v)
        return v

    @model_validator(mode="before")
    @classmethod
    def _cpu_only_means_no_gpus(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("cpu_only") and "gpus" not in data:
            return {**data, "gpus": 0}
        return data

    @model_validator(mode="after")
    def _cpu_only_is_consistent(self) -> Profile:
        if self.cpu_only:
            if self.gpus:
                raise ValueError(f"a cpu_only profile uses no GPUs; remove gpus: {self.gpus} or cpu_only")
            if not self.memory_gb:
                raise ValueError("a cpu_only profile must declare memory_gb (host memory per replica)")
        elif self.gpus == 0:
            raise ValueError("gpus: 0 needs cpu_only: true (and memory_gb)")
        return self


class Weights(Document):
    source: str = Field(
        default="",
        max_length=1024,
        description="what replicas load: an absolute path on the nodes, or hf://ORG/NAME (fetched)",
    )
    revision: str = Field(
        default="",
        max_length=128,
        description="the revision (hub commit, tag or branch) replicas load; changing it rolls them",
    )

    @model_validator(mode="after")
    def _one_revision(self) -> Weights:
        if self.source.startswith("hf://"):
            if not _HUB_SOURCE.match(self.source):
                raise ValueError(f"weights source {self.source!r} is not hf://ORG/NAME[@REVISION]")
            _, at, pin = self.source.partition("@")
            if at and self.revision and pin != self.revision:
                raise ValueError(
                    f"weights source {self.source!r} pins revision {pin!r} but weights.revision is "
                    f"{self.revision!r}; give the revision in one place"
                )
        return self


class Scaling(Document):
    min: int = Field(default=1, ge=0, le=1024, description="replicas kept running; 0: on demand")
    max: int | None = Field(default=None, ge=1, le=1024, description="upper bound; default: max(min, 1)")
    idle_timeout_seconds: float = Field(
        default=300.0, gt=0, le=7 * 86400, description="an on-demand model idle this long scales to zero"
    )
    target_load: float = Field(
        default=16.0,
        gt=0,
        description="requests per replica (in flight, queued at the engine, or held) the autoscaler aims for",
    )
    scale_up_seconds: float = Field(
        default=10.0, ge=0, le=3600, description="load stays above target this long before replicas are added"
    )
    scale_down_seconds: float = Field(
        default=120.0,
        ge=0,
        le=86400,
        description="load stays low enough for fewer replicas this long before replicas are removed",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Scaling:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"scaling.max ({self.max}) is below scaling.min ({self.min})")
        return self

    @property
    def upper(self) -> int:
        return self.max if self.max is not None else max(self.min, 1)


class Owner(Document):
    # Who the model belongs to, for people and for /v1/models (owned_by).
    org: str = Field(default="", max_length=128)
    # The team within the org.
    team: str = Field(default="", max_length=128)
    # The project within the team.
    project: str = Field(default="", max_length=128)

    @field_validator("org", "team", "project")
    @classmethod
    def _no_slash(cls, v: str) -> str:
        # The parts join into a path with "/" (spec.tenancy); a part holding one would be two.
        if "/" in v:
            raise ValueError(f"owner part {v!r} contains '/'; the parts join into org/team/project")
        return v


class Canary(Document):
    model: str = Field(description="the candidate model that takes a share of this model's requests")
    percent: float = Field(gt=0, le=100, description="share of requests sent to the candidate")

    @field_validator("model")
    @classmethod
    def _model_is_a_name(cls, v: str) -> str:
        return _check_name(v, "canary model")


_HUB_SOURCE = re.compile(r"^hf://[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(@[^\s@]{1,128})?$")


class Adapter(Document):
    name: str = Field(description="name clients use for the adapter")
    source: str = Field(
        max_length=1024, description="the LoRA weights: an absolute path, or hf://ORG/NAME[@REVISION]"
    )

    @field_validator("name")
    @classmethod
    def _name_is_a_name(cls, v: str) -> str:
        return _check_name(v, "adapter name")

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        # The agent's weights cache takes exactly these two forms (llmgw.agent.weights).
        if not (v.startswith("/") or _HUB_SOURCE.match(v)):
            raise ValueError(f"adapter source {v!r} is neither an absolute path nor hf://ORG/NAME[@REVISION]")
        return v


class Lora(Document):
    """How the engines of a model with adapters hold them (vLLM's --max-loras, --max-lora-rank)."""

    max_loras: int = Field(default=4, ge=1, le=256, description="adapters one replica holds at once")
    max_rank: int = Field(default=16, ge=1, le=512, description="the largest adapter rank engines accept")


class EvalGate(Document):
    suite: str = Field(
        min_length=1,
        max_length=128,
        description="evaluation suite a version must pass (settings: eval_suites)",
    )
    min_score: float = Field(ge=0, description="lowest score that passes")


class ComfyUI(Document):
    """An image model served by ComfyUI: the workflow the router fills, and what the engine loads."""

    workflow: str = Field(
        default="txt2img",
        max_length=1024,
        description="a built-in workflow's name (txt2img), or the absolute path of an API-format "
        "workflow JSON file on the control plane",
    )
    checkpoint: str = Field(
        default="",
        max_length=256,
        description="the checkpoint file name the workflow loads (ckpt_name); default: the file name "
        "of weights.source",
    )
    environment: str = Field(
        default="",
        max_length=63,
        description="models naming the same environment share one ComfyUI replica (comfyui-env-NAME)",
    )
    custom_nodes: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="absolute paths of custom-node folders on the node, loaded by the engine",
    )

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, v: str) -> str:
        if v not in BUILTIN_WORKFLOWS and not (v.startswith("/") and v.endswith(".json")):
            raise ValueError(
                f"workflow {excerpt(v)} is neither a built-in ({', '.join(BUILTIN_WORKFLOWS)}) nor the "
                "absolute path of a .json file"
            )
        return v

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint(cls, v: str) -> str:
        if "/" in v or v in (".", ".."):
            raise ValueError(f"checkpoint {excerpt(v)} must be a file name, without a folder")
        return v

    @field_validator("environment")
    @classmethod
    def _environment(cls, v: str) -> str:
        if v and not _ENVIRONMENT.match(v):
            raise ValueError(f"environment {excerpt(v)}: 1-63 lowercase letters, digits and '-'")
        return v

    @field_validator("custom_nodes")
    @classmethod
    def _nodes(cls, v: list[str]) -> list[str]:
        for path in v:
            if not path.startswith("/") or "," in path:
                raise ValueError(f"custom node folder {excerpt(path)} must be an absolute path without ','")
        return v


class External(Document):
    url: str = Field(description="base URL of an OpenAI-compatible provider (without /v1)")
    # The provider's API dialect: openai, or comfyui (a ComfyUI server; the
    # model's comfyui section names its workflow and checkpoint).
    api: Literal["openai", "comfyui"] = "openai"
    model: str = Field(default="", max_length=256, description="the provider's model name; default: ours")
    api_key_file: str = Field(default="", max_length=1024, description="file holding the provider key")

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not re.match(r"^https?://[^\s/]+", v):
            raise ValueError(f"external url {excerpt(v)} must start with http:// or https:// and name a host")
        return v.rstrip("/")


class ModelSpec(Document):
    # The name clients send as `model`; unique across names and aliases.
    name: str
    # Other names clients may use for the model.
    aliases: list[str] = Field(default_factory=list, max_length=64)
    # How to run it, in priority order: the first that fits a node is used
    # (`profile:` is shorthand for a list of one).
    profiles: list[Profile] = Field(default_factory=list, max_length=16)
    # Where the weights come from (a local path or hf://ORG/NAME) and their revision.
    weights: Weights = Field(default_factory=Weights)
    # Replica bounds and autoscaling (`min_replicas:` is shorthand for scaling.min).
    scaling: Scaling = Field(default_factory=Scaling)
    # critical (may evict opportunistic replicas when there is no room),
    # standard (never evicts) or opportunistic (may be evicted).
    capacity_class: CapacityClass = "standard"
    # Who owns the model.
    owner: Owner = Field(default_factory=Owner)
    owned_by: str = Field(default="", max_length=128, description="shown in /v1/models; default: owner.org")
    # Models (names or aliases) that answer, in order, when this one has no capacity.
    fallbacks: list[str] = Field(default_factory=list, max_length=16)
    # A candidate model that takes a percent share of this model's requests.
    canary: Canary | None = None
    # LoRA adapters served with the base model: loaded at runtime on some of its
    # replicas (see llmgw.control.decide.adapters) and routed by name.
    adapters: list[Adapter] = Field(default_factory=list, max_length=64)
    # Engines start with LoRA enabled when this is set or adapters are declared;
    # only then can adapters be added later without a restart.
    lora: Lora | None = None
    # The evaluation a version must pass before it is published (a suite of the
    # cluster settings' eval_suites; see leader.lifecycle).
    eval_gate: EvalGate | None = None
    # Served by an OpenAI-compatible provider instead of replicas (no profiles then).
    external: External | None = None
    # The APIs it serves (a chat model, an embedding model, a reranker); empty: every API.
    # Routers refuse a request for another API with a 400 naming these.
    apis: list[ApiName] = Field(default_factory=list, max_length=16)
    # An image model served by ComfyUI (engine comfyui, or external with api: comfyui).
    comfyui: ComfyUI | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "profile" in data:
            if "profiles" in data:
                raise ValueError("give either profile or profiles, not both")
            data["profiles"] = [data.pop("profile")]
        if "min_replicas" in data:
            scaling = data.get("scaling")
            if isinstance(scaling, dict) and "min" in scaling:
                raise ValueError("give either min_replicas or scaling.min, not both")
            base = scaling if isinstance(scaling, dict) else {}
            data["scaling"] = {**base, "min": data.pop("min_replicas")}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, "model name")

    @field_validator("aliases", "fallbacks")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for a in v:
            _check_name(a, "name")
        if len(set(v)) != len(v):
            raise ValueError(f"{v} lists a name twice")
        return v

    @model_validator(mode="after")
    def _whole(self) -> ModelSpec:
        if self.external is not None and self.profiles:
            raise ValueError("an external model has no profiles; remove profiles or external")
        if self.external is None and not self.profiles:
            raise ValueError("a model needs at least one profile (or external: a provider)")
        if self.name in self.aliases:
            raise ValueError(f"alias {self.name!r} repeats the model's own name")
        if self.name in self.fallbacks:
            raise ValueError(f"model {self.name!r} lists itself as a fallback")
        if self.canary is not None and self.canary.model == self.name:
            raise ValueError(f"model {self.name!r} is its own canary candidate")
        if len(set(self.apis)) != len(self.apis):
            raise ValueError(f"apis {self.apis} lists an API twice")
        names = [a.name for a in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"adapter names {names} repeat")
        self._comfyui_is_consistent()
        return self

    def _comfyui_is_consistent(self) -> None:
        comfy_profiles = [p.engine == "comfyui" for p in self.profiles]
        external_comfy = self.external is not None and self.external.api == "comfyui"
        if any(comfy_profiles) and not all(comfy_profiles):
            raise ValueError(
                "a ComfyUI model's profiles are all engine: comfyui (its requests are workflows)"
            )
        if (any(comfy_profiles) or external_comfy) != (self.comfyui is not None):
            raise ValueError(
                "engine comfyui (or external api: comfyui) and the comfyui section go together; "
                "add comfyui: {workflow: ..., checkpoint: ...} or remove it"
            )
        if self.comfyui is None:
            return
        if self.apis and self.apis != ["images"]:
            raise ValueError(f"a ComfyUI model serves the images API only; apis is {self.apis}")
        if not self.comfy_checkpoint:
            raise ValueError("a ComfyUI model needs comfyui.checkpoint, or weights.source naming a file")
        if external_comfy:
            if self.comfyui.environment or self.comfyui.custom_nodes:
                raise ValueError("an external ComfyUI runs nothing here: no environment or custom_nodes")
        elif not self.weights.source.startswith("/"):
            raise ValueError(
                "a ComfyUI model's weights.source is the absolute path of its checkpoint file "
                "(or of the folder holding comfyui.checkpoint) on the node"
            )

    @property
    def comfy_checkpoint(self) -> str:
        """The ckpt_name its workflow loads: comfyui.checkpoint, or weights.source's file name."""
        if self.comfyui is None:
            return ""
        if self.comfyui.checkpoint:
            return self.comfyui.checkpoint
        base = self.weights.source.rstrip("/").rsplit("/", 1)[-1]
        return base if "." in base else ""

    @property
    def lora_settings(self) -> Lora | None:
        """The LoRA limits its engines start with; None: started without LoRA."""
        if self.lora is not None:
            return self.lora
        return Lora() if self.adapters else None

    @property
    def display_owner(self) -> str:
        return self.owned_by or self.owner.org or "llmgw"

    @property
    def version(self) -> str:
        """What a replica runs, as a short hash of the weights and the profiles.

        Changing either (source, revision, engine, args, resources) makes a
        new version, which replaces running replicas one at a time
        (decide.rollout); other fields (scaling, aliases, adapters, ...) do not.
        """
        doc = {"weights": self.weights.model_dump(), "profiles": [p.model_dump() for p in self.profiles]}
        return hashlib.sha256(json.dumps(_numbers_as_floats(doc), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def revision_label(self) -> str:
        """How people name the version: the weights' revision (else source) and the hash."""
        what = self.weights.revision or self.weights.source
        return f"{what} ({self.version})" if what else self.version


def _numbers_as_floats(value: Any) -> Any:
    """``0`` and ``0.0`` alike: a float field keeps the int YAML gave it, JSON from etcd reads a float."""
    if isinstance(value, dict):
        return {k: _numbers_as_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_numbers_as_floats(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value
