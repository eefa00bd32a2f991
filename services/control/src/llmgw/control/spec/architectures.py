"""Architectures each engine runs, for the load check (spec/loadcheck.py)."""

VLLM = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"})
