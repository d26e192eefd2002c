"""Shared helpers for the engine tests (model, KV, scheduler, runners, API).

A plain module (not conftest.py) so that its name cannot collide with other test packages'
conftest modules when the whole suite runs in one process.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from engine import LLM, Engine, EngineConfig, ModelConfig

TINY_MODEL = ModelConfig(vocab_size=64, hidden_size=32, num_heads=2, num_layers=1, num_loops=3,
                         intermediate_size=64, eos_token_id=0, seed=1)


def tiny_llm(**overrides) -> LLM:
    """An LLM over the tiny random-weight model (fast), with small blocks to cross boundaries."""
    options = dict(model_config=TINY_MODEL, block_size=4, num_kv_blocks=4096)
    options.update(overrides)
    return LLM(EngineConfig(**options))


HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def no_host_reads(monkeypatch: pytest.MonkeyPatch):
    """Inside: every way to read a tensor on the host, and torch.cuda.synchronize, raises
    AssertionError("host read ...")."""
    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"host read via {name} on the device-only path")
        return read

    with monkeypatch.context() as patch:
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, refuse(name))
        patch.setattr(torch.cuda, "synchronize", refuse("torch.cuda.synchronize"))
        yield


def run_checking_live(engine: Engine, check) -> tuple[list, int]:
    """Step the engine to the end, calling check(engine, request) after every step for each
    request still live; returns (finished outputs, number of checks)."""
    live, outputs, checked = dict(engine._requests), [], 0
    while engine.has_unfinished():
        outputs += engine.step()
        for request in live.values():
            if not request.is_finished:
                check(engine, request)
                checked += 1
    return outputs, checked


def count_non_argmax_accepted(engine: Engine, outputs) -> int:
    """Accepted drafts that are not the argmax of the full-depth serial replay (random rows
    accepting a non-greedy draft: the case that must still leave a consistent state)."""
    count = 0
    for output in outputs:
        ids = output.prompt_token_ids + output.token_ids
        target = engine.model.replay(torch.tensor(ids), engine.model.num_depths).logits[-1]
        for i, source in enumerate(output.token_sources):
            position = len(output.prompt_token_ids) + i
            count += source == "accepted" and ids[position] != int(target[position - 1].argmax())
    return count
