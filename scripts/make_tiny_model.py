"""Write a tiny random-weight Llama model that a real vLLM can serve.

    <vllm venv>/bin/python scripts/make_tiny_model.py [OUT_DIR]   (default <repo>/.llmgw/models/tiny-llama)

Nothing can be fetched from a model hub here, and the tests need a real
engine to load a real checkpoint, so the project makes its own: a
Llama-architecture model with random weights (about 0.46 M parameters), a
byte-level BPE tokenizer trained on local text, and a chat template, all
written with ``save_pretrained`` so vLLM loads the directory like any
downloaded model. It says nothing sensible; it exercises every part of the
serving path (tokenizer, chat template, prefill, decode, streaming, metrics).

Runs with the vLLM venv's Python (scripts/install_vllm.sh), which has torch,
transformers and tokenizers; llmgw's own venv needs none of them.

Decisions:

- Shape: hidden 128 with 4 heads gives a head size of 32, the smallest the
  vLLM CPU attention backend accepts (16 is refused at load). Two layers,
  intermediate 256, vocabulary 512, 512 positions: loading and a forward
  pass cost milliseconds.
- The tokenizer is trained on a fixed list of files from Python's own
  standard library (English docstrings and code, identical for a given
  Python version), not on this repository's docs, so editing a README does
  not change the model. Byte-level, so any input encodes.
- Deterministic: the weights come from a fixed torch seed and BPE training
  is deterministic for fixed input, so two runs write identical files.
- The chat template is plain Jinja: ``<|role|>`` headers, messages ended by
  ``<|end|>`` (the EOS token), an open ``<|assistant|>`` header for
  ``add_generation_prompt``. It renders each message's content verbatim,
  which is what ``continue_final_message`` needs: the renderer cuts the
  prompt right after the final message's content.
- Skips the work when OUT_DIR already holds a model made by this version of
  the script (a stamp file), so test sessions can call it every time.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

VERSION = 1
DEFAULT_OUT = Path(__file__).resolve().parents[1] / ".llmgw" / "models" / "tiny-llama"
STAMP = "llmgw-tiny-model.json"
SEED = 1234

SPECIAL_TOKENS = ["<|begin|>", "<|end|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]

# Standard-library files the tokenizer learns from (sorted, read in order).
CORPUS_FILES = [
    "argparse.py",
    "asyncio/events.py",
    "collections/__init__.py",
    "dataclasses.py",
    "email/message.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "pathlib.py",
    "subprocess.py",
    "textwrap.py",
    "typing.py",
]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

MODEL_SHAPE = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
}


def corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in CORPUS_FILES:
        path = stdlib / name
        if not path.exists():
            raise SystemExit(f"make_tiny_model: {path} is missing; this Python has no full standard library")
        texts.append(path.read_text(encoding="utf-8"))
    return texts


def train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )


def build_model(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        **MODEL_SHAPE,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    # Stored in bfloat16, the dtype the engine serves it in (--dtype bfloat16),
    # so loading converts nothing.
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.max_new_tokens = 64
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(DEFAULT_OUT), help=f"output directory ({DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="rewrite even when the stamp says it is current")
    args = parser.parse_args(argv)
    out = Path(args.out)
    stamp = out / STAMP
    if not args.force and stamp.exists():
        try:
            if json.loads(stamp.read_text()).get("version") == VERSION:
                print(f"make_tiny_model: {out} is current")
                return 0
        except (OSError, ValueError):
            pass
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        raise SystemExit(
            f"make_tiny_model: {err.name} is missing; run this with the vLLM venv's python "
            "(scripts/install_vllm.sh makes it: .llmgw/engines/vllm/bin/python)"
        ) from None

    tokenizer = train_tokenizer(MODEL_SHAPE["vocab_size"])
    model = build_model(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    stamp.write_text(json.dumps({"version": VERSION, "seed": SEED, "parameters": params}) + "\n")
    print(f"make_tiny_model: wrote {out} ({params} parameters, vocabulary {len(tokenizer)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
