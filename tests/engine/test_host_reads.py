"""The per-round device work never reads tensor data on the host; only `collect` does.

Every Python-level way to read a tensor's values (item, tolist, numpy, bool/int/float/index
conversion, cpu) is made to raise while the round's device functions run. Round plans are built
from host values only, so they are built outside the guarded region, as the engine does.
"""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.runners.base import SamplingRows
from engine.runners.speculative import plan_round
from tests.fixtures.engine_helpers import TINY_LLAMA, no_host_reads, random_llama_weights, tiny_llm


def tiny_llama_llm(**options):
    """The engine over a random-weight Llama (one layer per depth): the real-model family's path."""
    from engine import LLM, EngineConfig
    from engine.models.llama import LlamaDepthModel, LlamaModel

    model = LlamaDepthModel(LlamaModel(TINY_LLAMA, random_llama_weights(TINY_LLAMA)), 1)
    return LLM(EngineConfig(block_size=4, num_kv_blocks=4096, draft_loops=1, **options), model=model)


def started_engine(mode: str, family: str = "looped"):
    make = tiny_llm if family == "looped" else tiny_llama_llm
    engine = make(mode=mode, num_speculative_tokens=3).engine
    params = [
        SamplingParams(temperature=0.0, max_tokens=8),
        SamplingParams(seed=1, max_tokens=8),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=2, max_tokens=2),
    ]
    for i, p in enumerate(params):
        engine.add_request(str(i), [1 + i, 2, 3], p)
    batch = engine.scheduler.schedule()
    engine.kv.zero_blocks(engine.scheduler.blocks.take_allocated())
    engine.runner.prefill(batch.prefill)
    return engine, batch


@pytest.mark.parametrize("family", ["looped", "llama"])
def test_speculative_round_has_no_host_reads(monkeypatch, family):
    engine, batch = started_engine("sync", family)
    runner, device = engine.runner, engine.device
    assert batch.num_drafts == (3, 3, 1)  # the max_tokens=2 row is ragged
    with torch.inference_mode():
        plan = plan_round(batch.num_drafts, runner.num_speculative_tokens, device)
        frame = runner.frame(batch.decode, [r.num_computed + k + 1 for r, k in zip(batch.decode, batch.num_drafts)])
        rows = SamplingRows.from_requests(batch.decode, device)
        with no_host_reads(monkeypatch):
            uniforms = runner.uniforms(rows, 2 * runner.num_speculative_tokens + 1)
            drafts = runner.draft(frame, plan, rows, uniforms)
            target = runner.verify(frame, plan, rows, drafts)
            result = runner.accept(plan, rows, drafts, target, uniforms)
    assert result.tokens.shape == (3, 4)


@pytest.mark.parametrize("family", ["looped", "llama"])
def test_plain_step_has_no_host_reads(monkeypatch, family):
    engine, batch = started_engine("nospec", family)
    with torch.inference_mode():
        rows = SamplingRows.from_requests(batch.decode, engine.device)
        with no_host_reads(monkeypatch):
            tokens = engine.runner.decode(batch.decode, rows)
    assert tokens.shape == (3,)


def test_the_guard_catches_a_host_read(monkeypatch):
    with no_host_reads(monkeypatch), pytest.raises(AssertionError, match="host read"):
        int(torch.tensor(3))
