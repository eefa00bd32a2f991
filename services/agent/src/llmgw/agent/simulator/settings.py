"""What one simulator process is configured to be: a frozen value built once.

The CLI (``main.py``) is the edge that turns flags into this value; tests and
other components build it directly. It checks its own ranges so an
in-process caller gets the same clear message a command-line user does.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.common.errors import InvalidArgument

DEFAULT_MODEL_NAME = "simulated-model"
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SimulatorSettings:
    host: str = "127.0.0.1"
    # 0 asks the OS for a free port; the bound one is reported by SimulatorServer.
    port: int = 0
    # vLLM semantics: the first name is the primary one (it labels the metrics);
    # the model answers to every name listed.
    served_model_names: tuple[str, ...] = (DEFAULT_MODEL_NAME,)
    # What /v1/models reports as ``root`` (vLLM's --model, the weights' path).
    model: str | None = None
    # vLLM's --revision of the weights; only reported (see weights_served).
    revision: str | None = None
    # When set, every /v1/* request must carry ``Authorization: Bearer <key>``.
    api_key: str | None = None
    ttft_ms: float = 50.0
    # Prefill cost of each prompt token the prefix cache does not hold, added to ttft_ms.
    prefill_us_per_token: float = 0.0
    # Prefix cache size in blocks of block_size tokens (LRU); 0 disables it.
    prefix_cache_blocks: int = 4096
    block_size: int = 16
    itl_ms: float = 10.0
    output_tokens: int = 32
    max_num_seqs: int = 16
    max_model_len: int = 4096
    seed: int = 0
    embedding_dim: int = 16
    # On shutdown, in-flight requests get this long to finish before they are cancelled.
    shutdown_timeout_s: float = 2.0
    max_body_bytes: int = MAX_BODY_BYTES
    # LoRA (see lora.py): on or off, vLLM's limits (accepted, not enforced), the
    # adapters loaded at start, and whether they may be loaded and unloaded at runtime.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    lora_modules: tuple[tuple[str, str], ...] = ()
    runtime_lora_updating: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not self.served_model_names or any(not n for n in self.served_model_names):
            problems.append("served_model_names must list at least one non-empty name")
        if not 0 <= self.port <= 65535:
            problems.append(f"port must be 0..65535, got {self.port}")
        non_negative = (
            "ttft_ms",
            "itl_ms",
            "shutdown_timeout_s",
            "prefill_us_per_token",
            "prefix_cache_blocks",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("output_tokens", "max_num_seqs", "max_model_len", "embedding_dim", "block_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lora_modules and not self.enable_lora:
            problems.append("lora_modules need enable_lora (--enable-lora)")
        if self.api_key == "":
            problems.append("api_key must not be empty; leave it unset to disable auth")
        if problems:
            raise InvalidArgument("simulator settings: " + "; ".join(problems))

    @property
    def primary_model(self) -> str:
        return self.served_model_names[0]

    @property
    def model_root(self) -> str:
        return self.model or self.primary_model

    @property
    def weights_served(self) -> str | None:
        """What completions report as ``system_fingerprint``: the weights given (``--model``, with
        ``@REVISION`` when one was), so a client sees which weights answered; None when none were."""
        if self.model is None:
            return None
        return f"{self.model}@{self.revision}" if self.revision else self.model
