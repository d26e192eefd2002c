"""Batched collection on CUDA: captured rounds give the tokens of eager rounds and of
`LLM.generate`, for every mode, whatever the batch size and padding. Skipped without a GPU.

Exact equality (see tests/engine/runners/test_collection.py): a difference would mean that a row's
logits depend on the batch it runs in, or that the captured round differs from the eager one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, EngineConfig, SamplingParams
from engine.runners.collection import BatchCollector

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPT = "The speculative sampler must be lossless."
MAX_TOKENS = 5
SEEDS = list(range(1000, 1200))  # 200 requests: ragged rounds and rejections occur
SAMPLING = dict(temperature=0.8, top_k=50, top_p=0.9)
MODES = [
    dict(mode="nospec"),
    dict(mode="sync", draft_loops=2),
    dict(mode="sync", draft_loops=1),
    dict(mode="async", draft_loops=2),
]


def columns(out):
    counts = np.stack([out.num_rounds, out.num_draft_tokens, out.num_accepted_tokens])
    return out.tokens, out.sources, counts, out.drafts


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m['mode']}-{m.get('draft_loops', 0)}")
def test_captured_collection_equals_eager_and_generate(mode):
    llm = LLM(EngineConfig(device="cuda", num_kv_blocks=8192, **mode))
    params = SamplingParams(**SAMPLING, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompt = llm.tokenizer.encode(PROMPT)
    captured = BatchCollector(llm.engine)
    graphs = columns(captured.collect(prompt, params, SEEDS, MAX_TOKENS, batch_size=256))
    assert captured.disabled_reason is None and captured._shapes  # the round was captured
    assert captured.graph_status == "1 batch shape(s) captured as CUDA Graphs"
    halves = [
        columns(captured.collect(prompt, params, part, MAX_TOKENS, batch_size=256)) for part in (SEEDS[:77], SEEDS[77:])
    ]
    eager = columns(BatchCollector(llm.engine, capture=False).collect(prompt, params, SEEDS, MAX_TOKENS))
    outs = llm.generate(
        [prompt] * len(SEEDS),
        [SamplingParams(**SAMPLING, seed=s, max_tokens=MAX_TOKENS, ignore_eos=True) for s in SEEDS],
    )
    engine_tokens = np.array([o.token_ids for o in outs])
    engine_counts = np.array(
        [[o.num_rounds for o in outs], [o.num_draft_tokens for o in outs], [o.num_accepted_tokens for o in outs]]
    )
    np.testing.assert_array_equal(graphs[0], eager[0])
    np.testing.assert_array_equal(graphs[0], np.concatenate([halves[0][0], halves[1][0]]))
    np.testing.assert_array_equal(graphs[2], eager[2])
    np.testing.assert_array_equal(graphs[3], eager[3])  # the drafts, written inside the captured round
    np.testing.assert_array_equal(graphs[3], np.concatenate([halves[0][3], halves[1][3]]))
    np.testing.assert_array_equal(graphs[0], engine_tokens)
    np.testing.assert_array_equal(graphs[2], engine_counts)


@pytest.mark.parametrize("mode", MODES[:2], ids=lambda m: m["mode"])
def test_llama_rounds_are_captured_and_equal_eager(mode):
    """The real-model family's rounds are captured too (a host read in them makes the capture fail
    and the collection run eagerly, ~10x slower): captured tokens equal eager ones."""
    from engine.models.llama import LlamaDepthModel, LlamaModel
    from tests.fixtures.engine_helpers import TINY_LLAMA, random_llama_weights

    model = LlamaDepthModel(LlamaModel(TINY_LLAMA, random_llama_weights(TINY_LLAMA).to(device="cuda")), 1)
    options = {**mode, "draft_loops": 1} if "draft_loops" in mode else mode  # the tiny model has 3 depths
    llm = LLM(EngineConfig(device="cuda", num_kv_blocks=8192, num_speculative_tokens=2, **options), model=model)
    params = SamplingParams(**SAMPLING, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompt = [3, 7, 11, 5]
    captured = BatchCollector(llm.engine)
    graphs = columns(captured.collect(prompt, params, SEEDS, MAX_TOKENS, batch_size=256))
    assert captured.graph_status == "1 batch shape(s) captured as CUDA Graphs", captured.graph_status
    eager = columns(BatchCollector(llm.engine, capture=False).collect(prompt, params, SEEDS, MAX_TOKENS))
    np.testing.assert_array_equal(graphs[0], eager[0])
    np.testing.assert_array_equal(graphs[2], eager[2])
    np.testing.assert_array_equal(graphs[3], eager[3])


def test_planned_batches_run_the_probe_as_the_planned_rows_with_its_tokens():
    """`EngineSUT.plan_batches(256)` on CUDA: a two-request batch (the probe's) runs in the one
    captured shape of 256 rows, and its requests get the tokens they get in a batch of their
    own size (a row's logits do not depend on the batch: this file's guarantee)."""
    from specval.adapters.engine import EngineSUT
    from specval.protocol import GroupSpec, SamplingSpec, SutSpec

    options = (("collection", "batched"), ("num_kv_blocks", 8192))
    group, sampling = GroupSpec(name="sync", mode="sync", draft_loops=1), SamplingSpec(**SAMPLING)
    seeds = np.array(SEEDS[:2], dtype=np.int64)
    batches = []
    for plan in (256, None):
        sut = EngineSUT(SutSpec(adapter="engine", model="looped", device="cuda", options=options), 3)
        prompt = sut.encode(PROMPT)
        if plan:
            sut.plan_batches(plan)
        batches.append(sut.sample(group, prompt, sampling, seeds, MAX_TOKENS, MAX_TOKENS))
        (collector,) = sut._collectors.values()
        assert [key[0] for key in collector._shapes] == [plan or len(seeds)]  # (rows, blocks, lengths)
        sut.close()
    assert np.array_equal(batches[0].tokens, batches[1].tokens)
