"""Shared helpers for the engine tests (model, KV, scheduler, runners, API).

A plain module (not conftest.py) so that its name cannot collide with other test packages'
conftest modules when the whole suite runs in one process.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from engine import LLM, Engine, EngineConfig, ModelConfig
from engine.models.llama import LayerWeights, LlamaConfig, LlamaWeights

FLOAT32_UNIT_ROUNDOFF = 2.0**-24
REDUCTION_LAMBDA = 6.0  # probabilistic summation bound, see reorder_atol
CANCELLATION = 4.0  # assumed ratio of a reduction's sum of |terms| to the largest output magnitude

TINY_MODEL = ModelConfig(vocab_size=64, hidden_size=32, num_heads=2, num_layers=1, num_loops=3,
                         intermediate_size=64, eos_token_id=0, seed=1)

TINY_LLAMA = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
                         num_kv_heads=2, rope_theta=10000.0, rms_norm_eps=1e-5, context_length=64,
                         tie_embeddings=True, bos_token_id=1, eos_token_id=2)


def random_llama_weights(config: LlamaConfig, seed: int = 0) -> LlamaWeights:
    """Random Llama weights (tied embeddings) of `config`, fixed by `seed`."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.3) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    layers = tuple(
        LayerWeights(attn_norm=1 + rand(h, scale=0.1), wq=rand(config.num_heads * d, h),
                     wk=rand(config.num_kv_heads * d, h), wv=rand(config.num_kv_heads * d, h),
                     wo=rand(h, config.num_heads * d), ffn_norm=1 + rand(h, scale=0.1),
                     w_gate=rand(i, h), w_up=rand(i, h), w_down=rand(h, i))
        for _ in range(config.num_layers))
    embed = rand(config.vocab_size, h, scale=1.0)
    return LlamaWeights(embed=embed, layers=layers, final_norm=1 + rand(h, scale=0.1), lm_head=embed)


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


def reorder_atol(scale: float, *, num_reductions: int, max_terms: int) -> float:
    """Bound on |a - b| for two float32 evaluations of the same network that differ only in the
    order of their sums (batched vs per-sequence matmuls, paged vs contiguous attention, the
    vectorised kernels another CPU selects).

    Analysis (Higham & Mary 2019, probabilistic rounding errors: independent, mean zero, each
    <= u): a float32 sum of n terms in any order is off by <= LAMBDA * sqrt(n) * u * sum|terms|,
    and a chain of `num_reductions` such sums, whose errors pass on with gain <= 1, by
    <= LAMBDA * sqrt(num_reductions * n) * u * sum|terms| (all its roundings are one sum of
    independent errors); exceeded with probability <= N * 2 exp(-LAMBDA**2 / 2), ~2e-5 for the
    N ~ 1,000 roundings of the small test models. Assumption: every reduction's sum |terms| is
    within CANCELLATION of `scale`, the largest |output| (RMSNorm holds every layer input at
    unit rms; the residual stream keeps later layers on the scale of the output). Each
    evaluation is within LAMBDA * sqrt(num_reductions * n) * u * CANCELLATION * scale of the
    exact value, the two within twice that.
    """
    roundings = num_reductions * max_terms
    per_evaluation = REDUCTION_LAMBDA * math.sqrt(roundings) * FLOAT32_UNIT_ROUNDOFF
    return 2 * per_evaluation * CANCELLATION * scale


LOOPED_REDUCTIONS_PER_LAYER = 9  # 2 RMSNorm means, qkv, scores, softmax sum, values, out, gate/up, down
READOUT_REDUCTIONS = 2  # final RMSNorm mean, LM head


def looped_atol(model, expected: torch.Tensor, num_positions: int) -> float:
    """`reorder_atol` for any output of a LoopedModel (logits, or keys / values at any depth):
    at most every layer of every depth plus the readout are chained before it, and its longest
    sum has max(hidden, intermediate, num_positions) terms; `scale` is max |expected|."""
    config = model.config
    return reorder_atol(
        float(expected.abs().max()),
        num_reductions=LOOPED_REDUCTIONS_PER_LAYER * config.num_layers * config.num_loops
        + READOUT_REDUCTIONS,
        max_terms=max(config.hidden_size, config.intermediate_size, num_positions))
