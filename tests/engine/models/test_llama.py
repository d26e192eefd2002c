"""Llama-family forward on small random weights: properties that pin each component down.

Deterministic (fixed torch seeds, no sampling). Tolerances: comparisons of the same function
evaluated in two summation orders (incremental vs full, paged vs contiguous, GQA vs duplicated
heads) use `logit_atol` (tests/fixtures/engine_helpers.py, reorder_atol: a float32 rounding analysis over the
network's chained reductions); comparisons of the same ops on the same inputs are bitwise.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.models.llama import ContiguousAttention, LlamaModel, apply_rope, rms_norm, rope_cos_sin
from tests.fixtures.engine_helpers import FLOAT32_UNIT_ROUNDOFF as U
from tests.fixtures.engine_helpers import TINY_LLAMA, no_host_reads, reorder_atol
from tests.fixtures.engine_helpers import random_llama_weights as random_weights

TINY = TINY_LLAMA


# Chained float32 reductions per layer: attention RMSNorm mean, q/k/v projection, scores, softmax
# sum, weighted values, output projection, MLP RMSNorm mean, gate/up, down; then the final norm
# and the LM head. The longest sum has max(hidden 32, intermediate 48, <= 9 positions) terms.
REDUCTIONS_PER_LAYER, READOUT_REDUCTIONS, MAX_TERMS = 9, 2, 48


def logit_atol(expected: torch.Tensor, num_layers: int = TINY.num_layers) -> float:
    """Largest float32 difference of two summation orders of `num_layers` layers (see module doc)."""
    return reorder_atol(
        float(expected.abs().max()),
        max_terms=MAX_TERMS,
        num_reductions=REDUCTIONS_PER_LAYER * num_layers + READOUT_REDUCTIONS,
    )


def assert_same_logits(actual: torch.Tensor, expected: torch.Tensor, num_layers: int = TINY.num_layers) -> None:
    torch.testing.assert_close(actual, expected, atol=logit_atol(expected, num_layers), rtol=0)


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return LlamaModel(TINY, random_weights(TINY))


def tokens(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def test_rms_norm_matches_definition():
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(5, 8, generator=gen), torch.randn(8, generator=gen)
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    # Both sides: a mean of 8 positive squares (<= 7u relative in any order, halved by the square
    # root), then sqrt + division vs rsqrt (<= 2 roundings each) and two products: <= 12u relative
    # per element, no cancellation anywhere; 16u leaves a margin of 4 roundings.
    torch.testing.assert_close(rms_norm(x, w, 1e-6), expected, rtol=16 * U, atol=0)


def test_rope_scores_depend_only_on_relative_position():
    gen = torch.Generator().manual_seed(6)
    q, k = torch.randn(1, 1, 16, generator=gen), torch.randn(1, 1, 16, generator=gen)

    def score(m: int, n: int) -> float:
        cq, sq = rope_cos_sin(torch.tensor([m]), 16, 10000.0)
        ck, sk = rope_cos_sin(torch.tensor([n]), 16, 10000.0)
        return float((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum())

    # float32 angles m * f are off by <= u * m (f <= 1), so cos/sin by <= u * m + 2u absolute;
    # each rotated element by <= (2(u * m + 2u) + 3u) times its pair's norm, and the score, a sum
    # of 16 products, by <= (that for q and for k + 18u) * |q| |k|. At m = 104 this is ~450u.
    bound = (2 * (2 * (U * 104 + 2 * U) + 3 * U) + 18 * U) * float(q.norm() * k.norm())
    assert abs(score(7, 3) - score(104, 100)) <= 2 * bound
    assert abs(score(7, 3) - score(7, 4)) > 20 * bound  # another offset: far outside rounding
    cos, sin = rope_cos_sin(torch.tensor([5]), 16, 10000.0)
    # a rotation keeps the norm: <= 3u (x cos + r sin) + 4u (cos, sin) relative per pair, 2u norm
    assert abs(float(apply_rope(q, cos, sin).norm()) - float(q.norm())) <= 16 * U * float(q.norm())


def test_incremental_decoding_matches_full_forward(model):
    ids = tokens(9)
    full = model.forward(ids)
    attend = ContiguousAttention(TINY.num_layers)
    chunks = [(0, 5), (5, 6), (6, 9)]  # prefill, one decode step, a 3-token verify block
    for start, stop in chunks:
        positions = torch.arange(start, stop)
        hidden = model.run_layers(model.embed(ids[start:stop]), positions, 0, TINY.num_layers, attend)
        assert_same_logits(model.readout(hidden), full[start:stop])
    assert attend.length(TINY.num_layers - 1) == 9


def test_causality_later_tokens_do_not_change_earlier_logits(model):
    ids = tokens(8)
    changed = ids.clone()
    changed[5:] = (changed[5:] + 1) % TINY.vocab_size
    a, b = model.forward(ids), model.forward(changed)
    assert_same_logits(a[:5], b[:5])  # a longer sequence may change the matmul blocking
    assert not torch.allclose(a[5:], b[5:])


def test_early_exit_equals_truncated_model(model):
    ids = tokens(6)
    shallow, full = model.early_exit(ids, (1, TINY.num_layers))
    truncated_config = replace(TINY, num_layers=1)
    truncated = LlamaModel(truncated_config, replace(model.weights, layers=model.weights.layers[:1]))
    assert torch.equal(shallow, truncated.forward(ids))  # the same ops on the same inputs
    assert torch.equal(full, model.forward(ids))
    assert not torch.allclose(shallow, full)


def test_grouped_query_attention_equals_duplicated_kv_heads(model):
    """GQA with 2 kv heads == full multi-head attention whose kv heads repeat each group's weights."""
    group, d = TINY.num_heads // TINY.num_kv_heads, TINY.head_dim

    def widen(w: torch.Tensor) -> torch.Tensor:
        return w.view(TINY.num_kv_heads, d, -1).repeat_interleave(group, dim=0).reshape(TINY.num_heads * d, -1)

    layers = tuple(replace(layer, wk=widen(layer.wk), wv=widen(layer.wv)) for layer in model.weights.layers)
    mha = LlamaModel(replace(TINY, num_kv_heads=TINY.num_heads), replace(model.weights, layers=layers))
    ids = tokens(7)
    assert_same_logits(mha.forward(ids), model.forward(ids))


def test_bf16_forward_tracks_fp32(model):
    ids = tokens(6)
    low = LlamaModel(TINY, model.weights.to(torch.bfloat16))
    assert low.weights.lm_head is low.weights.embed
    ref, out = model.forward(ids), low.forward(ids)
    assert out.dtype == torch.float32
    assert float((out - ref).abs().max()) < 0.05 * float(ref.abs().max())


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="num_kv_heads"):
        replace(TINY, num_kv_heads=3)
    with pytest.raises(ValueError, match="hidden_size"):
        replace(TINY, hidden_size=30)
    with pytest.raises(ValueError, match="eos_token_id"):
        replace(TINY, eos_token_id=50)


def test_bad_weights_and_inputs_are_rejected(model):
    bad = replace(model.weights, final_norm=torch.ones(31))
    with pytest.raises(ValueError, match="final_norm"):
        LlamaModel(TINY, bad)
    with pytest.raises(ValueError, match="token_ids"):
        model.forward(torch.tensor([0, TINY.vocab_size]))
    with pytest.raises(ValueError, match="context_length"):
        model.forward(torch.zeros(TINY.context_length + 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="depths"):
        model.early_exit(tokens(3), (2, 1))


def _paged_step(adapter, cache, tables, starts, chunks, depths):
    """Run packed rows of several sequences through depths 1..depths; return readout [N, V]."""
    from engine.runners.layout import depth_metadata, layout_rows

    layout = layout_rows(starts, [len(c) for c in chunks], cache.layout.block_size, torch.device("cpu"))
    hidden = adapter.embed(torch.cat(chunks))
    for depth in range(1, depths + 1):
        metadata = depth_metadata(layout, [table[depth - 1] for table in tables])
        hidden = adapter.forward_depth(depth, hidden, layout.positions, metadata, cache)
    return adapter.readout(hidden)


@pytest.mark.parametrize("layers_per_depth", [1, 3])
def test_depth_adapter_on_paged_cache_matches_reference(model, layers_per_depth):
    """Two sequences, prefill then a 2-token verify block, through the engine's paged attention."""
    from engine.kv_cache import KVLayout, PagedKVCache
    from engine.models.llama import LlamaDepthModel

    adapter = LlamaDepthModel(model, layers_per_depth)
    cache = PagedKVCache(
        KVLayout(
            num_blocks=1 + 2 * adapter.num_depths * 3,
            block_size=4,
            num_layers=layers_per_depth,
            num_heads=adapter.num_kv_heads,
            head_size=adapter.head_size,
        ),
        torch.float32,
        "cpu",
    )
    blocks = iter(range(1, cache.layout.num_blocks))
    tables = [[[next(blocks) for _ in range(3)] for _ in range(adapter.num_depths)] for _ in range(2)]
    seqs = [tokens(8, seed=3), tokens(5, seed=4)]
    prefill = _paged_step(adapter, cache, tables, [0, 0], [seqs[0][:6], seqs[1][:3]], adapter.num_depths)
    verify = _paged_step(adapter, cache, tables, [6, 3], [seqs[0][6:], seqs[1][3:]], adapter.num_depths)
    expected = [model.forward(s) for s in seqs]
    assert_same_logits(prefill, torch.cat([expected[0][:6], expected[1][:3]]))
    assert_same_logits(verify, torch.cat([expected[0][6:], expected[1][3:]]))
    replay = adapter.replay(seqs[0], 1)
    assert_same_logits(replay.logits[0], model.early_exit(seqs[0], (layers_per_depth,))[0], layers_per_depth)
    assert replay.keys.shape == (1, layers_per_depth, 8, TINY.num_heads, TINY.head_dim)


@pytest.mark.parametrize("layers_per_depth", [1, TINY.num_layers])
def test_depth_adapter_target_logits_are_replays_last_readout_bit_for_bit(model, layers_per_depth):
    """The same layer steps in the same order, one readout: equal bits, not merely close ones."""
    from engine.models.llama import LlamaDepthModel

    adapter, ids = LlamaDepthModel(model, layers_per_depth), tokens(11, seed=7)
    assert torch.equal(adapter.target_logits(ids), adapter.replay(ids, adapter.num_depths).logits[-1])
    with pytest.raises(ValueError, match="context_length"):
        adapter.target_logits(tokens(TINY.context_length + 1))


def test_depth_adapter_rejects_bad_grouping(model):
    from engine.models.llama import LlamaDepthModel

    with pytest.raises(ValueError, match="layers_per_depth=2"):
        LlamaDepthModel(model, 2)


@pytest.mark.parametrize("mode", ["nospec", "sync"])
def test_engine_serves_llama_depth_model(model, mode):
    """End to end through the engine: greedy output equals the reference greedy decoding, with and
    without early-exit speculation."""
    from engine import LLM, EngineConfig, SamplingParams
    from engine.models.llama import LlamaDepthModel

    prompt = [3, 7, 11, 5]
    expected = model.greedy_continuation(torch.tensor(prompt), 6)
    config = EngineConfig(mode=mode, draft_loops=1, num_speculative_tokens=2, num_kv_blocks=64, block_size=4)
    llm = LLM(config, model=LlamaDepthModel(model, 1))
    output = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    llm.close()
    assert output.token_ids == expected


def test_depth_adapter_embed_reads_nothing_back_to_the_host(model, monkeypatch):
    """The serving path's embed must not synchronise (a CUDA Graph capture fails on a host read, and
    the rounds then run eagerly): it returns the reference rows bit for bit with every host read
    refused; an id outside the vocabulary still raises (on the CPU)."""
    from engine.models.llama import LlamaDepthModel

    adapter = LlamaDepthModel(model, 1)
    ids = tokens(7, seed=5)
    with no_host_reads(monkeypatch):
        got = adapter.embed(ids)
    assert torch.equal(got, model.embed(ids))
    with pytest.raises(IndexError):
        adapter.embed(torch.tensor([0, TINY.vocab_size]))
