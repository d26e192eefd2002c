"""Shared helpers for the engine tests (model, KV, scheduler, runners, API).

A plain module (not conftest.py) so that its name cannot collide with other test packages'
conftest modules when the whole suite runs in one process.
"""

from __future__ import annotations

from engine import LLM, EngineConfig, ModelConfig

TINY_MODEL = ModelConfig(vocab_size=64, hidden_size=32, num_heads=2, num_layers=1, num_loops=3,
                         intermediate_size=64, eos_token_id=0, seed=1)


def tiny_llm(**overrides) -> LLM:
    """An LLM over the tiny random-weight model (fast), with small blocks to cross boundaries."""
    options = dict(model_config=TINY_MODEL, block_size=4, num_kv_blocks=4096)
    options.update(overrides)
    return LLM(EngineConfig(**options))
