"""Planted bugs: never active by default, selected by name, and each accept-rule mutant's exact
single-draft law (quadrature, no sampling error) differs from p exactly when it should.

All checks are deterministic (no sampling), so the false-fail rate is 0. Caveat: a mutant that
breaks the piecewise-constant cell structure (residual_from_p) is not seen by quadrature on every
pair; on the pair below it is, and the kill table records what the model's own pairs show.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from engine import LLM, EngineConfig, SamplingParams, mutants
from engine.runners.base import DEFAULT_OPS, SamplingRows, round_uniforms
from engine.runners.collection import BatchCollector
from specval.adapters.engine import EngineSUT
from specval.distribution.reference import transform
from specval.protocol import GroupSpec, SamplingSpec, SutSpec
from specval.stats.quadrature import quadrature_check, restrict_to_support
from tests.fixtures.engine_helpers import TINY_MODEL

CHANGES_T1_LAW = ("residual_from_p", "residual_unnormalised", "residual_abs", "ratio_inverted")
KEEPS_T1_LAW = ("accept_le", "uniform_reused", "bonus_wrong_position", "bonus_from_q", "accept_by_division")


def _accept_fn(name: str | None):
    spec = SutSpec(options=(() if name is None else (("mutant", name),)))
    return EngineSUT(spec, 1).accept_single  # needs no model: it calls the (mutant) accept rule only


def _pair() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)  # on some pairs residual_from_p hides between cell midpoints (seed 3)
    p, q = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
    p[2] = 0.0  # a token the draft proposes but the target forbids
    return (p / p.sum()).astype(np.float32), q.astype(np.float32)


def test_default_config_runs_the_engines_own_operations():
    assert EngineConfig().mutant is None and mutants.sampling_ops(None) is DEFAULT_OPS
    assert DEFAULT_OPS.verify_context is None and not DEFAULT_OPS.reads_prompt_length  # no extra work
    assert all(m.ops is not DEFAULT_OPS for m in mutants.MUTANTS if m.layer == mutants.ENGINE_LAYER)
    assert len(set(mutants.MUTANT_NAMES)) == len(mutants.ALL_MUTANTS) >= 22
    assert any(m.equivalent for m in mutants.MUTANTS)


def test_unknown_mutant_is_a_value_error_naming_the_field():
    with pytest.raises(ValueError, match="mutant='nope'"):
        EngineConfig(mutant="nope")


@pytest.mark.parametrize("name", CHANGES_T1_LAW)
def test_quadrature_kills_accept_rule_mutants(name):
    p, q = _pair()
    assert quadrature_check(p, q, _accept_fn(None), 1e-6).passed
    assert not quadrature_check(p, q, _accept_fn(name), 1e-6).passed


@pytest.mark.parametrize("name", KEEPS_T1_LAW)
def test_mutants_outside_the_single_draft_law_keep_it(name):
    p, q = _pair()
    assert quadrature_check(p, q, _accept_fn(name), 1e-6).passed


def test_stop_point_accepts_a_forbidden_token_only_under_accept_le():
    p, q = _pair()
    u = np.array([[0.0, 0.0, 0.5]])
    for name, accepts in ((None, False), ("accept_le", True), ("accept_by_division", False)):
        first = _accept_fn(name)(np.array([2]), q[None], p[None], u)
        assert (int(first[0]) == 2) == accepts, name


PROMPT = "The speculative sampler must be lossless."  # t1_quadrature's prompt
SAMPLING = SamplingSpec(temperature=1.0, top_k=20, top_p=1.0)  # t1_quadrature's sampling


def _prompt_pair(draft_loops: int) -> tuple[np.ndarray, np.ndarray]:
    """p and q of the default looped model at t1_quadrature's prompt, cut to their supports."""
    sut = EngineSUT(SutSpec(), 1)
    try:
        ids = sut.encode(PROMPT)
        p = transform(sut.target_logits(ids), SAMPLING).astype(np.float32)
        q = transform(sut.draft_logits(GroupSpec("sync", "sync", draft_loops), ids), SAMPLING).astype(np.float32)
    finally:
        sut.close()
    p_cut, q_cut, _ = restrict_to_support(p, q)
    return p_cut, q_cut


def _ratio_off(offset: float):
    """The engine's accept rule (torch) with the ratio moved: accept iff u < p(x)/q(x) + offset."""
    accept = mutants.accept_op(mutants.AcceptMutation(accept_rule=lambda u, q_x, p_x: u < p_x / q_x + offset))

    def first_token(draft_tokens, draft_probs, target_probs, uniforms):
        rows = len(draft_tokens)
        result = accept(
            torch.from_numpy(np.ascontiguousarray(draft_tokens)),
            torch.arange(rows + 1),
            torch.from_numpy(np.ascontiguousarray(draft_probs)),
            torch.from_numpy(np.repeat(target_probs, 2, axis=0)),
            torch.from_numpy(np.ascontiguousarray(uniforms)),
            torch.zeros(rows, dtype=torch.bool),
        )
        return result.tokens[:, 0].numpy()

    return first_token


@pytest.mark.parametrize("draft_loops", [1, 2])
def test_an_accept_ratio_off_by_a_thousandth_fails_on_the_prompt_pair(draft_loops):
    # The sweep's resolution is 1/2^16 = 1.5e-5; an additive 1e-3 on the ratio moves
    # q(x)/T_q * 1e-3 of mass at every x with p(x) < q(x), ~1e-4 on this model's pairs.
    p, q = _prompt_pair(draft_loops)
    assert quadrature_check(p, q, _accept_fn(None)).passed
    result = quadrature_check(p, q, _ratio_off(1e-3))
    assert not result.passed and result.max_abs_error > 2 * result.resolution, result.to_dict()


def test_accept_single_uses_the_protocols_backend():
    # sampling_backend reaches speculative_accept: 'triton' on CPU tensors without the
    # interpreter is refused by the engine, so a dropped option would pass silently here.
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set: Triton runs on the CPU")
    p, q = _pair()
    sut = EngineSUT(SutSpec(options=(("sampling_backend", "triton"),)), 1)
    with pytest.raises(ValueError, match="backend='triton'"):
        sut.accept_single(np.array([0]), q[None], p[None], np.array([[0.5, 0.5, 0.5]]))


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", [None, "residual_from_p"])
def test_on_cuda_the_quadrature_runs_the_triton_accept_kernel(monkeypatch, mutant):
    # A cuda protocol's EngineSUT puts the rows on the GPU, where 'auto' resolves to the Triton
    # kernel; the spy proves the kernel ran (not torch on CPU tensors) and the sweep passes it
    # (and still kills a mutant, whose rule wraps the same kernel).
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    from engine.sampling.kernels import accept as accept_kernel

    calls = []
    real = accept_kernel.accept_triton
    monkeypatch.setattr(accept_kernel, "accept_triton", lambda *a, **k: calls.append(a[0].device) or real(*a, **k))
    options = () if mutant is None else (("mutant", mutant),)
    sut = EngineSUT(SutSpec(device="cuda", options=options), 1)
    p, q = _pair()
    result = quadrature_check(p, q, sut.accept_single)
    assert calls and all(device.type == "cuda" for device in calls)
    assert result.passed == (mutant is None), result.to_dict()


# ---------------------------------------------------------------- sequence and pair mutants
#
# Deterministic (fixed seeds, no statistics): a mutant's tokens are compared with the correct
# engine's for the same seeds. Before the first difference both runs made the same rounds, so the
# correct run's provenance of the first differing token says where the mutant first acted. The tiny
# random model has nearly flat logits (std 0.1), so the requests run at temperature 0.05 (logit std
# ~2) to make wrong rows and wrong uniforms change tokens within 32 tokens.

SEQ_PROMPT = [5, 9, 17, 2, 33, 40, 1, 8, 12, 60, 7, 3]
SEQ_SEEDS = list(range(8))
SEQ_TOKENS = 32
SHARP_TEMPERATURE = 0.05
GOLDEN_SPECULATIVE = [  # the engine before these mutants existed: K = 4, draft_loops 1, seeds 0..3, 24 tokens
    [32, 48, 17, 7, 39, 11, 8, 10, 28, 15, 56, 56, 56, 10, 25, 40, 52, 31, 38, 61, 43, 21, 8, 23],
    [1, 60, 52, 50, 26, 62, 55, 45, 37, 21, 36, 23, 0, 57, 12, 23, 33, 53, 3, 57, 12, 23, 0, 2],
    [25, 31, 38, 1, 41, 7, 41, 35, 28, 15, 24, 25, 62, 7, 35, 28, 9, 53, 30, 63, 30, 63, 52, 16],
    [32, 3, 52, 16, 15, 17, 13, 59, 25, 50, 8, 46, 27, 17, 13, 11, 59, 43, 20, 48, 13, 5, 43, 28],
]
GOLDEN_NOSPEC_FIRST = [32, 62, 19, 10, 44, 23, 0, 46, 54, 11, 43, 21, 14, 38, 21, 32, 63, 39, 11, 42, 50, 61, 4, 14]


def _llm(mode: str = "sync", mutant: str | None = None, k: int = 4, draft_loops: int = 1, device: str = "cpu") -> LLM:
    return LLM(
        EngineConfig(
            model_config=TINY_MODEL,
            mode=mode,
            num_speculative_tokens=k,
            draft_loops=draft_loops,
            num_kv_blocks=1024,
            block_size=4,
            mutant=mutant,
            device=device,
        )
    )


def _collect(
    mode: str = "sync",
    mutant: str | None = None,
    max_tokens: int = SEQ_TOKENS,
    seeds=SEQ_SEEDS,
    k: int = 4,
    draft_loops: int = 1,
    device: str = "cpu",
):
    params = SamplingParams(temperature=SHARP_TEMPERATURE, max_tokens=max_tokens, ignore_eos=True)
    engine = _llm(mode, mutant, k, draft_loops, device).engine
    return BatchCollector(engine).collect(SEQ_PROMPT, params, list(seeds), max_tokens)


@pytest.fixture(scope="module")
def correct():
    return _collect()


def _first_differences(correct_batch, mutant_batch) -> list[int | None]:
    """Per request: the first index where the mutant's tokens differ (None: identical)."""
    firsts = []
    for want, have in zip(correct_batch.tokens, mutant_batch.tokens):
        differ = np.flatnonzero(want != have)
        firsts.append(int(differ[0]) if differ.size else None)
    return firsts


@pytest.mark.parametrize("mode", ["nospec", "sync", "async"])
def test_the_correct_engine_keeps_its_tokens(mode):
    batch = _collect(mode, max_tokens=24, seeds=range(4))
    if mode == "nospec":
        assert batch.tokens[0].tolist() == GOLDEN_NOSPEC_FIRST
    else:
        assert batch.tokens.tolist() == GOLDEN_SPECULATIVE


def test_sequence_mutants_are_apart_from_the_prefix_registry():
    # today's adapter lists MUTANTS only (specval.adapters.engine); the sequence ones are named by `needs`
    names = {m.name for m in mutants.SEQUENCE_MUTANTS}
    assert names == {
        "correlated_streams",
        "wrong_row_late_draft",
        "residual_from_p_late",
        "q_first_row",
        "wrong_row_deep_draft",
        "frozen_offset",
        "offset_overlap",
        "stale_context",
        "greedy_step",
    }
    assert not names & {m.name for m in mutants.MUTANTS}
    assert {m.needs for m in mutants.SEQUENCE_MUTANTS} == {
        mutants.NEEDS_SEQUENCE,
        mutants.NEEDS_PAIRS,
        mutants.NEEDS_MIXED,
    }
    assert all(m.needs == mutants.NEEDS_PREFIX for m in mutants.MUTANTS)
    assert all(m.breaks and m.visible_at and m.ops is not DEFAULT_OPS for m in mutants.SEQUENCE_MUTANTS)
    assert mutants.get(mutants.WRONG_BONUS_ROW).visible_at.startswith("t_{K+1}")
    assert EngineConfig(mutant="stale_context").mutant == "stale_context"


def test_correlated_streams_mirror_the_even_row_and_keep_it():
    seeds = torch.tensor([3, 4, 5, 6, 7])
    rows = SamplingRows(*(torch.zeros(5),) * 4, seeds, torch.tensor([12, 12, 15, 13, 12]), torch.full((5,), 12))
    right, mirrored = round_uniforms(rows, 9), mutants.get("correlated_streams").ops.uniforms(rows, 9)
    assert torch.equal(mirrored[0::2], right[0::2])
    assert torch.equal(mirrored[1::2], (1.0 - right[0:4:2]).clamp(max=mutants.LARGEST_BELOW_ONE))


def test_correlated_streams_change_odd_slots_only(correct):
    batch = _collect(mutant="correlated_streams")
    firsts = _first_differences(correct, batch)
    assert all(first is None for first in firsts[0::2])
    assert all(first is not None for first in firsts[1::2])


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("wrong_row_late_draft", lambda batch, b, i: batch.round_position[b, i] >= mutants.LATE_POSITION),
        (
            "residual_from_p_late",
            lambda batch, b, i: (
                batch.source_names()[b, i] == "correction" and batch.round_position[b, i] >= mutants.LATE_POSITION
            ),
        ),
        ("q_first_row", lambda batch, b, i: batch.round_position[b, i] >= 2),
        (mutants.WRONG_BONUS_ROW, lambda batch, b, i: batch.source_names()[b, i] == "bonus"),
        ("frozen_offset", lambda batch, b, i: i + 1 >= mutants.FROZEN_AFTER + 2),
        ("offset_overlap", lambda batch, b, i: batch.round_index[b, i] >= 1),
        ("stale_context", lambda batch, b, i: i + 1 >= mutants.STALE_AFTER + 3),
    ],
)
def test_sequence_mutants_act_exactly_where_they_claim(correct, name, where):
    firsts = _first_differences(correct, _collect(mutant=name))
    changed = [(b, i) for b, i in enumerate(firsts) if i is not None]
    assert len(changed) >= len(SEQ_SEEDS) // 2, firsts
    for b, i in changed:
        assert where(correct, b, i), (name, b, i, correct.round_position[b, : i + 1].tolist())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the Triton paged attention)")
def test_stale_context_acts_on_cuda_where_attention_is_a_kernel():
    """On CUDA the paged attention is a Triton kernel that sees keys by position alone; the
    mutant's narrowed mask must still reach the verify rows (they take the torch path)."""
    firsts = _first_differences(_collect(device="cuda"), _collect(mutant="stale_context", device="cuda"))
    changed = [i for i in firsts if i is not None]
    assert len(changed) >= len(SEQ_SEEDS) // 2, firsts
    assert all(i + 1 >= mutants.STALE_AFTER + 3 for i in changed), firsts


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(
                    not torch.cuda.is_available(), reason="needs a CUDA device (the Triton accept kernel)"
                ),
            ],
        ),
    ],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_wrong_row_deep_draft_is_invisible_below_k_6_and_acts_from_position_6(mode, device):
    """Deterministic. At K = 4 no draft reaches round position 6: every token equals the correct
    engine's. At K = 8, with the draft one loop short of the target (rounds run long), the tokens
    first change at a draft of round position >= 6, and they do change. On CUDA the rounds run the
    Triton accept kernel, which must take the mutated rows the same way."""
    on = {"device": device}
    assert np.array_equal(_collect(mode, "wrong_row_deep_draft", **on).tokens, _collect(mode, **on).tokens)
    deep = {"k": 8, "draft_loops": TINY_MODEL.num_loops - 1, **on}
    correct, mutated = _collect(mode, **deep), _collect(mode, "wrong_row_deep_draft", **deep)
    changed = [(b, i) for b, i in enumerate(_first_differences(correct, mutated)) if i is not None]
    assert changed
    for b, i in changed:
        assert correct.round_position[b, i] >= mutants.DEEP_POSITION, (b, i, correct.round_position[b, : i + 1])


@pytest.mark.parametrize("mode", ["nospec", "sync", "async"])
def test_greedy_step_acts_only_on_steps_holding_a_greedy_request(mode):
    """Deterministic. Without a greedy neighbour the mutant's tokens are the correct engine's; next
    to one, the random requests turn greedy: their tokens equal a greedy request's."""
    seeds = range(4)
    random = [SamplingParams(temperature=1.0, seed=s, max_tokens=SEQ_TOKENS, ignore_eos=True) for s in seeds]
    greedy = SamplingParams(temperature=0.0, seed=99, max_tokens=SEQ_TOKENS, ignore_eos=True)
    alone = [o.token_ids for o in _llm(mode, "greedy_step").generate([SEQ_PROMPT] * 4, random)]
    assert alone == [o.token_ids for o in _llm(mode).generate([SEQ_PROMPT] * 4, random)]
    mixed = [o.token_ids for o in _llm(mode, "greedy_step").generate([SEQ_PROMPT] * 5, random + [greedy])]
    assert mixed[:4] == [mixed[4]] * 4 and mixed[:4] != alone
    right = [o.token_ids for o in _llm(mode).generate([SEQ_PROMPT] * 5, random + [greedy])]
    assert right[:4] == alone and right[4] == mixed[4]


@pytest.mark.parametrize("name", ["frozen_offset", "offset_overlap", "stale_context", "wrong_row_late_draft"])
def test_sequence_mutants_act_the_same_through_the_async_engine(name):
    # LLM.generate in async mode (frontier, rounds in flight) reads the prompt length and the
    # committed length of each row the way batched collection does
    seeds = range(3)
    params = [
        SamplingParams(temperature=SHARP_TEMPERATURE, seed=s, max_tokens=SEQ_TOKENS, ignore_eos=True) for s in seeds
    ]
    outputs = _llm("async", name).generate([SEQ_PROMPT] * len(params), params)
    np.testing.assert_array_equal(np.array([o.token_ids for o in outputs]), _collect(mutant=name, seeds=seeds).tokens)


@pytest.mark.parametrize("mutant", [None, "draft_raw_ratio_filtered"])
def test_raw_drafts_fall_outside_the_processed_q_the_accept_uses(mutant):
    """Deterministic. The collected drafts replayed against the draft's processed q (temperature 0.8,
    top-k 20, top-p 0.9 of the draft logits along the committed prefix): the correct engine's every
    draft lies in its support; under `draft_raw_ratio_filtered` (drawn from the raw softmax) drafts
    outside it occur, though each of them was tested against that q."""
    sampling = SamplingSpec(temperature=0.8, top_k=20, top_p=0.9)
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=SEQ_TOKENS, ignore_eos=True)
    llm = _llm("sync", mutant)
    batch = BatchCollector(llm.engine).collect(SEQ_PROMPT, params, SEQ_SEEDS, SEQ_TOKENS)
    outside = 0
    for row, drafts, seed in zip(batch.tokens, batch.drafts, SEQ_SEEDS):
        drafted = np.flatnonzero(drafts >= 0)
        logits = llm.draft_logits_along(SEQ_PROMPT, row.tolist(), seed).double().numpy()[drafted]
        q = transform(logits, sampling)
        outside += int((q[np.arange(len(drafted)), drafts[drafted]] == 0).sum())
    assert (outside > 0) == (mutant is not None), outside
