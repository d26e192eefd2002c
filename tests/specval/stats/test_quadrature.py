"""Swept single-draft quadrature: order-free, tight to the grid's resolution, planted bugs caught.

These checks are deterministic (no sampling), so they have no false-fail rate. The bound they
rely on (module docstring of specval.stats.quadrature): a kernel with one u_final interval per
token and the exact accept split is within 1/G of the exact law per token, plus its rounding
(4 eps of the input dtype: the numpy rules below form max(p - q, 0) in float64 from the inputs).
"""

import os

import numpy as np
import pytest

from specval.adapters.engine import engine_accept_fn, engine_draft_fn
from specval.stats.adversarial import MIN_VOCAB, adversarial_pairs
from specval.stats.quadrature import (
    draft_quadrature_check,
    exact_law,
    quadrature_check,
    restrict_to_support,
    stop_point_case,
    stop_point_passed,
    stop_point_token,
    sweep_law,
)

ERROR_TOKEN = -1  # what the numpy rules below return for an empty residual
VOCABS = (MIN_VOCAB, 33)
SMALL_GRID = 1 << 10  # resolution 9.8e-4: fast, and far above every pair's rounding


def _categorical(weights, u, order=None):
    """First j (in `order`, default vocabulary order) with weight > 0 and cdf_j > u * total."""
    weights = np.asarray(weights, dtype=np.float64)
    order = np.arange(weights.shape[1]) if order is None else order
    cdf = np.cumsum(weights[:, order], axis=1)
    hit = (weights[:, order] > 0) & (cdf > u[:, None] * cdf[:, -1:])
    return np.where(hit.any(axis=1), order[hit.argmax(axis=1)], ERROR_TOKEN)


def _accept_rule(residual_of=lambda p, q: np.maximum(p - q, 0.0), accept_of=None, order_of=None):
    """A vectorised numpy K = 1 accept rule; each part can be replaced to plant a bug."""

    def accept(draft_tokens, draft_probs, target_probs, uniforms):
        rows = np.arange(draft_tokens.size)
        p = np.asarray(target_probs, dtype=np.float64)
        q = np.asarray(draft_probs, dtype=np.float64)
        p_x, q_x = p[rows, draft_tokens], q[rows, draft_tokens]
        accepted = (accept_of or (lambda u, q_x, p_x: u * q_x < p_x))(uniforms[:, 1], q_x, p_x)
        residual = residual_of(p, q)
        order = None if order_of is None else order_of(residual[0])
        return np.where(accepted, draft_tokens, _categorical(residual, uniforms[:, 2], order))

    return accept


CORRECT = _accept_rule()
RESIDUAL_FROM_P = _accept_rule(residual_of=lambda p, q: p)  # planted bug: correction drawn from p
SORTED_BY_MASS = _accept_rule(order_of=lambda r: np.argsort(-r, kind="stable"))  # correct, another order
REVERSED = _accept_rule(order_of=lambda r: np.arange(r.size)[::-1])  # correct, another order


def _pairs(vocab, seed=0):
    return {pair.name: pair for pair in adversarial_pairs(vocab, np.random.default_rng(seed))}


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("rule", [CORRECT, SORTED_BY_MASS, REVERSED], ids=["vocab_order", "by_mass", "reversed"])
def test_a_correct_rule_in_any_token_order_passes_every_adversarial_pair(vocab, rule):
    pairs = _pairs(vocab)
    assert len(pairs) == 12
    for name, pair in pairs.items():
        result = quadrature_check(pair.p, pair.q, rule, tol=0.0, grid_size=SMALL_GRID)
        assert result.passed, (name, result.to_dict())
        assert result.max_abs_error < 1.0 / SMALL_GRID and result.error_mass == 0.0, name


def test_the_resolution_is_attained_not_loose():
    # The bound 1/G is what the grid can promise: on generic pairs the error of a correct rule is a
    # sizeable fraction of it (here > 1/(4G) on the worst pair), and it shrinks as G grows.
    errors = {
        g: max(
            quadrature_check(pair.p, pair.q, SORTED_BY_MASS, tol=0.0, grid_size=g).max_abs_error
            for pair in _pairs(33).values()
        )
        for g in (64, 1024)
    }
    for grid_size, error in errors.items():
        assert 0.25 / grid_size < error < 1.0 / grid_size, errors


def test_more_intervals_per_token_need_a_proportional_allowance():
    # A correct law drawn through two intervals per token (each token's mass split in halves, one
    # in each half of [0, 1)): within 2/G, which intervals_per_token=2 allows.
    def split_halves(draft_tokens, draft_probs, target_probs, uniforms):
        p, q = np.asarray(target_probs, np.float64), np.asarray(draft_probs, np.float64)
        rows = np.arange(draft_tokens.size)
        residual = np.maximum(p - q, 0.0)
        doubled = np.concatenate([residual, residual], axis=1) / 2
        drawn = _categorical(
            doubled, uniforms[:, 2], np.r_[np.arange(p.shape[1]), np.arange(p.shape[1])[::-1] + p.shape[1]]
        )
        accepted = uniforms[:, 1] * q[rows, draft_tokens] < p[rows, draft_tokens]
        return np.where(accepted, draft_tokens, np.where(drawn < 0, drawn, drawn % p.shape[1]))

    for name, pair in _pairs(33, seed=4).items():
        result = quadrature_check(pair.p, pair.q, split_halves, tol=0.0, grid_size=64, intervals_per_token=2)
        assert result.passed and result.resolution == 2 / 64, (name, result.to_dict())


def test_float32_inputs_report_the_normalisation_apart():
    for name, pair in _pairs(33, seed=1).items():
        p, q = pair.p.astype(np.float32), pair.q.astype(np.float32)
        result = quadrature_check(p, q, CORRECT, tol=0.0, grid_size=SMALL_GRID)
        assert result.passed, (name, result.to_dict())
        assert result.allowance == pytest.approx(4 * np.finfo(np.float32).eps)
        assert result.law_deviation < 1e-6  # |L - p/T_p| <= |T_p - T_q| / T_q ~ 1e-7 in float32


def test_accept_ratio_off_by_a_thousandth_fails():
    # Additive error 1e-3 on the accept ratio moves q(x)/T_q * 1e-3 of mass at each x with
    # p(x) < q(x): on the dense pair > 1e-4, above 1/G + allowance = 1.5e-5 at G = 2^16.
    pair = _pairs(33)["dense"]
    off = _accept_rule(accept_of=lambda u, q_x, p_x: u < p_x / q_x + 1e-3)
    result = quadrature_check(pair.p.astype(np.float32), pair.q.astype(np.float32), off)
    assert not result.passed and result.max_abs_error > 1e-4, result.to_dict()
    assert quadrature_check(pair.p.astype(np.float32), pair.q.astype(np.float32), CORRECT).passed


def test_law_and_error_mass_sum_to_one():
    pair = _pairs(33)["dense"]
    law, error_mass, num_rows = sweep_law(pair.p, pair.q, RESIDUAL_FROM_P, grid_size=SMALL_GRID)
    assert law.sum() + error_mass == pytest.approx(1.0, abs=1e-12)
    assert num_rows == 2 * SMALL_GRID
    exact, exact_error = exact_law(pair.p, pair.q)
    assert exact.sum() + exact_error == pytest.approx(1.0, abs=1e-14) and exact_error == 0.0


@pytest.mark.parametrize("name", ["ties", "dense", "topk_draft", "topp_target", "onehot_draft"])
def test_residual_from_p_is_caught(name):
    pair = _pairs(33)[name]
    result = quadrature_check(pair.p, pair.q, RESIDUAL_FROM_P)
    assert not result.passed and result.tv > 1e-3, result.to_dict()


@pytest.mark.parametrize("name", ["disjoint", "topk_target"])
def test_residual_from_p_is_equivalent_where_the_residual_is_proportional_to_p(name):
    # Disjoint supports give max(p - q, 0) == p; a target that is the draft truncated and
    # renormalised (p = q / Z on its support) gives max(p - q, 0) = (1/Z - 1) q, proportional to p.
    pair = _pairs(33)[name]
    assert quadrature_check(pair.p, pair.q, RESIDUAL_FROM_P, tol=0.0, grid_size=SMALL_GRID).passed


def test_inverted_ratio_is_caught_on_disjoint_supports():
    # Accepting iff u p(x) < q(x) accepts every draft when p(x) = 0, so the law becomes q: TV = 1.
    pair = _pairs(33)["disjoint"]
    inverted = _accept_rule(accept_of=lambda u, q_x, p_x: u * p_x < q_x)
    result = quadrature_check(pair.p, pair.q, inverted, grid_size=SMALL_GRID)
    assert not result.passed and result.tv == pytest.approx(1.0)


def test_error_tokens_count_as_error_mass():
    def always_error(draft_tokens, draft_probs, target_probs, uniforms):
        return np.full(draft_tokens.size, ERROR_TOKEN)

    pair = _pairs(MIN_VOCAB)["dense"]
    result = quadrature_check(pair.p, pair.q, always_error, grid_size=SMALL_GRID)
    assert result.error_mass == pytest.approx(1.0) and not result.passed


def test_an_empty_residual_is_exact_error_mass():
    # p <= q everywhere with T_p < T_q: a rejection has probability (T_q - T_p) / T_q but no
    # residual; the exact law counts it as error mass, and a correct rule that flags it matches.
    q = np.array([0.5, 0.3, 0.2])
    p = q * (1 - 1e-3)
    result = quadrature_check(p, q, CORRECT, tol=0.0, grid_size=SMALL_GRID)
    assert result.exact_error_mass == pytest.approx(1e-3) and result.passed, result.to_dict()


def test_draft_check_is_order_free_and_catches_a_broken_draw():
    q = _pairs(33)["topp_draft"].q
    reversed_draw = lambda weights, u: _categorical(weights, u, np.arange(weights.shape[1])[::-1])  # noqa: E731
    assert draft_quadrature_check(q, _categorical, tol=0.0, grid_size=SMALL_GRID).passed
    assert draft_quadrature_check(q, reversed_draw, tol=0.0, grid_size=SMALL_GRID).passed
    assert not draft_quadrature_check(q, lambda weights, u: np.argmax(weights, axis=1)).passed


def test_the_stop_point_separates_the_strict_rule_from_accept_le():
    accept_le = _accept_rule(accept_of=lambda u, q_x, p_x: u * q_x <= p_x)
    p, _ = stop_point_case(np.float32)
    assert stop_point_passed(p, stop_point_token(CORRECT, np.float32))
    assert not stop_point_passed(p, stop_point_token(accept_le, np.float32))
    # ... which no sweep can see: u_accept = 0 is never a grid point.
    pair = _pairs(33)["tiny_overlap"]
    assert quadrature_check(pair.p, pair.q, accept_le, tol=0.0, grid_size=SMALL_GRID).passed


def test_bad_inputs_and_outputs_are_refused():
    pair = _pairs(33)["dense"]

    def wrong_shape(draft_tokens, draft_probs, target_probs, uniforms):
        return np.zeros((draft_tokens.size, 2), dtype=np.int64)

    with pytest.raises(ValueError, match="accept_fn"):
        sweep_law(pair.p, pair.q, wrong_shape, grid_size=SMALL_GRID)
    with pytest.raises(ValueError, match="same shape"):
        quadrature_check(pair.p, pair.q[:-1], CORRECT)
    with pytest.raises(ValueError, match="grid_size"):
        quadrature_check(pair.p, pair.q, CORRECT, grid_size=0)
    with pytest.raises(ValueError, match="vocab"):
        next(adversarial_pairs(4, np.random.default_rng(0)))


def test_restricting_to_the_support_keeps_the_law():
    pair = _pairs(33)["topp_target"]
    p, q = np.r_[pair.p, np.zeros(7)], np.r_[pair.q, np.zeros(7)]
    p_cut, q_cut, tokens = restrict_to_support(p, q, num_zero=2)
    assert list(tokens[-2:]) == [33, 34] and p_cut[-1] == q_cut[-1] == 0.0
    full, _, _ = sweep_law(p, q, CORRECT, grid_size=SMALL_GRID)
    cut, _, _ = sweep_law(p_cut, q_cut, CORRECT, grid_size=SMALL_GRID)
    assert np.array_equal(full[tokens], cut) and full.sum() == pytest.approx(cut.sum(), abs=1e-15)


def _engine_sampling():
    return pytest.importorskip("engine.sampling", reason="engine.sampling is not importable")


@pytest.mark.parametrize("vocab", VOCABS)
def test_engine_speculative_accept_torch_is_exact(vocab):
    _engine_sampling()
    accept, draft = engine_accept_fn(backend="torch"), engine_draft_fn(backend="torch")
    for name, pair in _pairs(vocab, seed=2).items():
        p, q = pair.p.astype(np.float32), pair.q.astype(np.float32)
        result = quadrature_check(p, q, accept, grid_size=SMALL_GRID)
        assert result.passed, (name, result.to_dict())
        assert draft_quadrature_check(q, draft, grid_size=SMALL_GRID).passed, name


def test_engine_adapter_refuses_float64():
    _engine_sampling()
    pair = _pairs(MIN_VOCAB)["dense"]
    with pytest.raises(ValueError, match="float32"):
        quadrature_check(pair.p, pair.q, engine_accept_fn(backend="torch"), grid_size=SMALL_GRID)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param("cuda", marks=pytest.mark.gpu),
    ],
)
def test_engine_speculative_accept_triton_is_exact(device):
    # The Triton kernel on CUDA (full grid), or on the CPU under TRITON_INTERPRET=1 (a grid of 64
    # and V = 8: the interpreter is slow).
    _engine_sampling()
    pytest.importorskip("engine.sampling.kernels.accept", reason="no Triton accept kernel in engine.sampling")
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("TRITON_INTERPRET=1 is not set: Triton cannot run on the CPU")
    accept = engine_accept_fn(backend="triton", device=device)
    vocab, grid_size = (MIN_VOCAB, 64) if device == "cpu" else (33, 1 << 16)
    for name, pair in _pairs(vocab, seed=3).items():
        result = quadrature_check(pair.p.astype(np.float32), pair.q.astype(np.float32), accept, grid_size=grid_size)
        assert result.passed, (name, result.to_dict())
