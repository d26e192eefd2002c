"""Exact single-draft quadrature: a correct accept rule reproduces p, planted bugs are caught.

These checks are deterministic (no sampling), so they have no false-fail rate: a correct rule
has error ~1e-16 plus the stated float32 normalisation slack.
"""

import os

import numpy as np
import pytest

from specval.stats.adversarial import MIN_VOCAB, adversarial_pairs
from specval.stats.quadrature import (
    draft_quadrature_check,
    engine_accept_fn,
    engine_draft_fn,
    normalisation_slack,
    quadrature_check,
    restrict_to_support,
    single_draft_law,
)

ERROR_TOKEN = -1  # what the numpy rules below return for an empty residual
VOCABS = (MIN_VOCAB, 33)


def _categorical(weights, u):
    """First j with weight > 0 and cdf_j > u * total (float64), per row; ERROR_TOKEN if total 0."""
    weights = np.asarray(weights, dtype=np.float64)
    cdf = np.cumsum(weights, axis=1)
    hit = (weights > 0) & (cdf > u[:, None] * cdf[:, -1:])
    return np.where(hit.any(axis=1), hit.argmax(axis=1), ERROR_TOKEN)


def _accept_rule(residual_of, ratio_inverted=False):
    """A vectorised numpy K = 1 accept rule with a pluggable residual (for planted bugs)."""

    def accept(draft_tokens, draft_probs, target_probs, uniforms):
        rows = np.arange(draft_tokens.size)
        p = np.asarray(target_probs, dtype=np.float64)
        q = np.asarray(draft_probs, dtype=np.float64)
        p_x, q_x = p[rows, draft_tokens], q[rows, draft_tokens]
        accepted = uniforms[:, 1] * (p_x if ratio_inverted else q_x) < (q_x if ratio_inverted else p_x)
        recovered = _categorical(residual_of(p, q), uniforms[:, 2])
        return np.where(accepted, draft_tokens, recovered)

    return accept


CORRECT = _accept_rule(lambda p, q: np.maximum(p - q, 0.0))
RESIDUAL_FROM_P = _accept_rule(lambda p, q: p)  # planted bug: correction drawn from p
RATIO_INVERTED = _accept_rule(lambda p, q: np.maximum(p - q, 0.0), ratio_inverted=True)


def _pairs(vocab, seed=0):
    return {pair.name: pair for pair in adversarial_pairs(vocab, np.random.default_rng(seed))}


@pytest.mark.parametrize("vocab", VOCABS)
def test_correct_rule_reproduces_p_on_every_adversarial_pair(vocab):
    pairs = _pairs(vocab)
    assert len(pairs) == 12
    for name, pair in pairs.items():
        result = quadrature_check(pair.p, pair.q, CORRECT, tol=1e-12)
        assert result.passed, (name, result.to_dict())
        assert result.max_abs_error <= 1e-12 and result.error_mass == 0.0, name


def test_float32_inputs_pass_within_the_normalisation_slack():
    for name, pair in _pairs(33, seed=1).items():
        p, q = pair.p.astype(np.float32), pair.q.astype(np.float32)
        result = quadrature_check(p, q, CORRECT, tol=1e-12)
        assert result.passed, (name, result.to_dict())
        assert result.normalisation_slack == pytest.approx(normalisation_slack(p, q))
        assert result.normalisation_slack < 1e-6


def test_law_and_error_mass_sum_to_one():
    pair = _pairs(33)["dense"]
    law, error_mass, num_cells = single_draft_law(pair.p, pair.q, RESIDUAL_FROM_P)
    assert law.sum() + error_mass == pytest.approx(1.0, abs=1e-14)
    assert num_cells > 33


@pytest.mark.parametrize("name", ["ties", "dense", "topk_draft", "topp_target", "onehot_draft"])
def test_residual_from_p_is_caught(name):
    pair = _pairs(33)[name]
    result = quadrature_check(pair.p, pair.q, RESIDUAL_FROM_P)
    assert not result.passed and result.tv > 1e-3, result.to_dict()


@pytest.mark.parametrize("name", ["disjoint", "topk_target"])
def test_residual_from_p_is_equivalent_where_the_residual_is_proportional_to_p(name):
    # Disjoint supports give max(p - q, 0) == p; a target that is the draft truncated and
    # renormalised (p = q / Z on its support) gives max(p - q, 0) = (1/Z - 1) q, proportional to p.
    # On these pairs the planted bug is an equivalent mutant, which the exact check confirms.
    pair = _pairs(33)[name]
    assert quadrature_check(pair.p, pair.q, RESIDUAL_FROM_P, tol=1e-12).passed


def test_inverted_ratio_is_caught_on_disjoint_supports():
    # Accepting iff u p(x) < q(x) accepts every draft when p(x) = 0, so the law becomes q: TV = 1.
    pair = _pairs(33)["disjoint"]
    inverted = quadrature_check(pair.p, pair.q, RATIO_INVERTED)
    assert not inverted.passed and inverted.tv == pytest.approx(1.0)


def test_error_tokens_count_as_error_mass():
    def always_error(draft_tokens, draft_probs, target_probs, uniforms):
        return np.full(draft_tokens.size, ERROR_TOKEN)

    pair = _pairs(MIN_VOCAB)["dense"]
    result = quadrature_check(pair.p, pair.q, always_error)
    assert result.error_mass == pytest.approx(1.0) and not result.passed


def test_empty_residual_with_unequal_totals_is_within_slack():
    # p <= q everywhere with T_p < T_q: a rejection has probability (T_q - T_p) / T_q but no
    # residual; a correct rule flags it, and that error mass stays within the slack.
    q = np.array([0.5, 0.3, 0.2])
    p = q * (1 - 1e-8)
    result = quadrature_check(p, q, CORRECT, tol=0.0)
    assert 0 < result.error_mass <= result.normalisation_slack
    assert result.passed


def test_draft_check_on_a_correct_and_a_broken_categorical():
    pair = _pairs(33)["topp_draft"]
    assert draft_quadrature_check(pair.q, _categorical, tol=1e-12).passed

    def float32_cdf_argmax(weights, u):  # planted bug: ignores u, always the mode
        return np.argmax(weights, axis=1)

    assert not draft_quadrature_check(pair.q, float32_cdf_argmax).passed


def test_max_cells_and_bad_outputs_are_refused():
    pair = _pairs(33)["dense"]
    with pytest.raises(ValueError, match="max_cells"):
        single_draft_law(pair.p, pair.q, CORRECT, max_cells=10)

    def wrong_shape(draft_tokens, draft_probs, target_probs, uniforms):
        return np.zeros((draft_tokens.size, 2), dtype=np.int64)

    with pytest.raises(ValueError, match="accept_fn"):
        single_draft_law(pair.p, pair.q, wrong_shape)
    with pytest.raises(ValueError, match="same shape"):
        quadrature_check(pair.p, pair.q[:-1], CORRECT)
    with pytest.raises(ValueError, match="vocab"):
        next(adversarial_pairs(4, np.random.default_rng(0)))


def _engine_sampling():
    return pytest.importorskip("engine.sampling", reason="engine.sampling is not importable")


@pytest.mark.parametrize("vocab", VOCABS)
def test_engine_speculative_accept_torch_is_exact(vocab):
    _engine_sampling()
    accept, draft = engine_accept_fn(backend="torch"), engine_draft_fn(backend="torch")
    for name, pair in _pairs(vocab, seed=2).items():
        p, q = pair.p.astype(np.float32), pair.q.astype(np.float32)
        result = quadrature_check(p, q, accept)
        assert result.passed, (name, result.to_dict())
        assert draft_quadrature_check(q, draft).passed, name


def test_engine_adapter_refuses_float64():
    _engine_sampling()
    pair = _pairs(MIN_VOCAB)["dense"]
    with pytest.raises(ValueError, match="float32"):
        quadrature_check(pair.p, pair.q, engine_accept_fn(backend="torch"))


def test_restricting_to_the_support_keeps_the_law():
    pair = _pairs(33)["topp_target"]
    p = np.r_[pair.p, np.zeros(7)]
    q = np.r_[pair.q, np.zeros(7)]
    p_cut, q_cut, tokens = restrict_to_support(p, q)
    full, _, _ = single_draft_law(p, q, CORRECT)
    cut, _, _ = single_draft_law(p_cut, q_cut, CORRECT)
    assert tokens.max() < 33 and np.allclose(full[tokens], cut, atol=1e-15)
    assert full.sum() == pytest.approx(cut.sum(), abs=1e-15)


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.gpu),
])
def test_engine_speculative_accept_triton_is_exact(device):
    # The Triton kernel on CUDA, or on the CPU under TRITON_INTERPRET=1 (small pairs: the
    # interpreter is slow).
    _engine_sampling()
    pytest.importorskip("engine.sampling.accept_kernel", reason="no Triton accept kernel in engine.sampling")
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("TRITON_INTERPRET=1 is not set: Triton cannot run on the CPU")
    accept = engine_accept_fn(backend="triton", device=device)
    vocab = MIN_VOCAB if device == "cpu" else 33
    for name, pair in _pairs(vocab, seed=3).items():
        result = quadrature_check(pair.p.astype(np.float32), pair.q.astype(np.float32), accept)
        assert result.passed, (name, result.to_dict())
