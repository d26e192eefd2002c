"""Padded static rounds (the CUDA Graph path) against eager rounds; CUDA Graphs on the GPU.

On the CPU the static-buffer round runs without capture: the same padding, scratch slot and
scratch block as the captured graphs. Deterministic (fixed seeds); equality of static and eager
rounds rests on padding rows never touching live state, and on the extra (masked) key blocks of
a bucket contributing exact zeros, which a near-tie could only expose with float32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, EngineConfig, SamplingParams
from engine.kv_cache import PAD_BLOCK, scratch_block
from engine.runners.graphs import RoundGraphs
from tests.fixtures.engine_helpers import tiny_llm

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]


def mixed_params(max_tokens: int = 14) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        SamplingParams(temperature=1.5, top_k=40, seed=3, max_tokens=max_tokens - 3, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, seed=4, max_tokens=max_tokens, ignore_eos=True),
    ]


def with_static_rounds(llm: LLM) -> list[tuple[int, ...]]:
    """Route rounds through uncaptured static buffers; returns a log of their K_r."""
    runner, rounds = llm.engine.runner, []
    graphs = RoundGraphs(runner, scratch_block(llm.engine.config.num_kv_blocks), capture=False, batch_sizes=(1, 2, 4))
    run = graphs.run

    def logged(requests, num_drafts, slots, tables):
        packed = run(requests, num_drafts, slots, tables)
        assert packed is not None  # every round of this test fits a bucket
        rounds.append(tuple(num_drafts))
        return packed

    graphs.run = logged
    runner.graphs = graphs
    return rounds


def test_static_padded_rounds_equal_eager_rounds():
    """Uniform and ragged rounds (K_r < K near max_tokens) through the static buffers give the
    eager rounds' tokens; padding rows and uncounted drafts touch no live state."""
    eager = tiny_llm(mode="async").generate(PROMPTS, mixed_params())
    llm = tiny_llm(mode="async")
    rounds = with_static_rounds(llm)
    outputs = llm.generate(PROMPTS, mixed_params())
    assert [o.token_ids for o in outputs] == [o.token_ids for o in eager]
    assert [o.token_sources for o in outputs] == [o.token_sources for o in eager]
    sizes = {len(r) for r in rounds}
    assert 3 in sizes and {1, 2} & sizes  # padded to 4; shrinking batches reuse buckets
    k = llm.engine.config.num_speculative_tokens
    assert any(min(r) < k for r in rounds if len(r) > 1)  # ragged rounds took the static path
    assert any(0 in r for r in rounds)  # ... including zero-draft rows
    engine = llm.engine
    blocks = engine.scheduler.blocks
    assert blocks.num_free == blocks.num_blocks and engine.runner.frontier.num_free == 1024
    for pool in engine.kv.key + engine.kv.value:
        assert not pool[PAD_BLOCK].any()  # padding rows wrote to the scratch block only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("num_requests", [1, 5])
def test_cuda_graphs_equal_eager_and_sync_on_cuda(num_requests):
    prompts = ["Return the number of", "Raise ValueError if", "A", "def f(x):", "import os"]
    params = [
        SamplingParams(temperature=1.0, top_k=20, seed=s, max_tokens=24 - s, ignore_eos=True)
        for s in range(num_requests)
    ]  # unequal lengths: ragged rounds replay graphs too
    params[0] = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    results = {}
    for name, options in (
        ("graphs", dict(mode="async")),
        ("eager", dict(mode="async", enforce_eager=True)),
        ("sync", dict(mode="sync")),
    ):
        llm = LLM(EngineConfig(device="cuda", **options))
        results[name] = [o.token_ids for o in llm.generate(prompts[:num_requests], params)]
        if name == "graphs":
            graphs = llm.engine.runner.graphs
            assert graphs.disabled_reason is None and graphs._rounds
        llm.close()
    assert results["graphs"] == results["eager"] == results["sync"]
