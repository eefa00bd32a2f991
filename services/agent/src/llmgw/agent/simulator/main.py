"""``llmgw-simulator`` / ``python -m llmgw.agent.simulator``: the entry point, wiring only.

Flags use vLLM's names where vLLM has them, because the agent launches the
simulator from the same kind of command template as vLLM (``--NAME VALUE``
per catalog arg). Unknown flags are an error, so a typo in a catalog entry
is seen at once; the exceptions are ``--tensor-parallel-size``,
``--gpu-memory-utilization`` and ``--dtype``, which templates commonly pass
and which mean nothing to a simulator: they are accepted, logged, ignored.

Once serving, it prints ``simulator listening on http://HOST:PORT`` to
stdout (flushed), with the bound port, so a launcher that passed
``--port 0`` learns it. SIGTERM or SIGINT shuts down gracefully (see
``server.py``) and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Sequence

from prometheus_client import disable_created_metrics

from llmgw.common.errors import InvalidArgument
from llmgw.common.telemetry import setup_logging

from .lora import parse_module, runtime_updating_allowed
from .server import SimulatorServer
from .settings import DEFAULT_MODEL_NAME, SimulatorSettings

log = logging.getLogger("llmgw.simulator")

IGNORED_FLAGS = ("tensor_parallel_size", "gpu_memory_utilization", "dtype")


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535 (0 picks a free port), got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw-simulator",
        description="vLLM-compatible engine simulator: OpenAI API, streaming, vLLM metrics.",
        allow_abbrev=False,
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, required=True, help="0 picks a free port")
    p.add_argument(
        "--served-model-name",
        nargs="+",
        metavar="NAME",
        help=f"names the model answers to; the first labels metrics (default: --model or "
        f"{DEFAULT_MODEL_NAME})",
    )
    p.add_argument("--model", help="reported as the model root; the served name if none given")
    p.add_argument("--revision", help="the weights' revision (vLLM's); reported with the weights served")
    p.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY"),
        help="require `Authorization: Bearer KEY` on /v1/* (default $VLLM_API_KEY, as vLLM; "
        "the environment keeps the key out of `ps`)",
    )
    p.add_argument("--ttft-ms", type=_non_negative, default=50.0, help="time to first token")
    p.add_argument("--itl-ms", type=_non_negative, default=10.0, help="inter-token latency")
    p.add_argument(
        "--prefill-us-per-token", type=_non_negative, default=0.0,
        help="prefill time per prompt token not in the prefix cache, added to --ttft-ms",
    )  # fmt: skip
    p.add_argument(
        "--prefix-cache-blocks", type=_non_negative_int, default=4096,
        help="prefix cache size in blocks (LRU); 0 disables it",
    )  # fmt: skip
    p.add_argument("--block-size", type=_positive_int, default=16, help="tokens per prefix-cache block")
    p.add_argument(
        "--output-tokens", type=_positive_int, default=32,
        help="tokens a reply has unless max_tokens cuts it short",
    )  # fmt: skip
    p.add_argument("--max-num-seqs", type=_positive_int, default=16, help="concurrent sequences")
    p.add_argument("--max-model-len", type=_positive_int, default=4096, help="context window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--embedding-dim", type=_positive_int, default=16)
    p.add_argument(
        "--shutdown-timeout", type=_non_negative, default=2.0,
        help="seconds in-flight requests get to finish on SIGTERM",
    )  # fmt: skip
    p.add_argument("--log-level", default="info")
    lora = p.add_argument_group(
        "LoRA adapters (as vLLM; runtime loading needs VLLM_ALLOW_RUNTIME_LORA_UPDATING)"
    )
    lora.add_argument("--enable-lora", action="store_true")
    lora.add_argument("--max-loras", type=_positive_int, default=1)
    lora.add_argument("--max-lora-rank", type=_positive_int, default=16)
    lora.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH")
    ignored = p.add_argument_group("accepted for vLLM template compatibility, ignored")
    ignored.add_argument("--tensor-parallel-size")
    ignored.add_argument("--gpu-memory-utilization")
    ignored.add_argument("--dtype")
    return p


def parse_settings(argv: Sequence[str] | None = None) -> tuple[SimulatorSettings, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    names = args.served_model_name or [args.model or DEFAULT_MODEL_NAME]
    try:
        settings = SimulatorSettings(
            host=args.host,
            port=args.port,
            served_model_names=tuple(names),
            model=args.model,
            revision=args.revision,
            api_key=args.api_key,
            ttft_ms=args.ttft_ms,
            itl_ms=args.itl_ms,
            prefill_us_per_token=args.prefill_us_per_token,
            prefix_cache_blocks=args.prefix_cache_blocks,
            block_size=args.block_size,
            output_tokens=args.output_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
            seed=args.seed,
            embedding_dim=args.embedding_dim,
            shutdown_timeout_s=args.shutdown_timeout,
            enable_lora=args.enable_lora,
            max_loras=args.max_loras,
            max_lora_rank=args.max_lora_rank,
            lora_modules=tuple(parse_module(m) for m in args.lora_modules),
            runtime_lora_updating=runtime_updating_allowed(),
        )
    except InvalidArgument as err:
        parser.error(str(err))
    return settings, args


async def run(settings: SimulatorSettings) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with SimulatorServer(settings) as server:
            print(f"simulator listening on {server.url}", flush=True)
            log.info(
                "serving %s: ttft=%sms itl=%sms prefill=%sus/token prefix_cache=%d blocks "
                "output_tokens=%d max_num_seqs=%d",
                ", ".join(settings.served_model_names), settings.ttft_ms, settings.itl_ms,
                settings.prefill_us_per_token, settings.prefix_cache_blocks,
                settings.output_tokens, settings.max_num_seqs,
            )  # fmt: skip
            await stop.wait()
            log.info("shutting down")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    settings, args = parse_settings(argv)
    # vLLM does the same: the *_created series only add noise to every scrape.
    # Process-global, hence here at the entry point and not in build_app.
    disable_created_metrics()
    setup_logging("llmgw.simulator", args.log_level)
    for name in IGNORED_FLAGS:
        value = getattr(args, name)
        if value is not None:
            log.info("ignoring --%s %s: it has no meaning for the simulator", name.replace("_", "-"),
                     value)  # fmt: skip
    asyncio.run(run(settings))
    return 0
