"""The output law of speculative_accept: exact quadrature (one draft, tolerance 1e-9) and ragged
Monte Carlo (false-fail rate <= 1e-3). The checks and their analysis: tests/fixtures/accept_law.py.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from tests.fixtures.accept_law import (
    MC_ALPHA,
    QUADRATURE_ATOL,
    V,
    check_ragged_law,
    chi_square_p,
    dyadic,
    mc_distributions,
    quadrature_law,
    run_ragged,
)


@pytest.mark.parametrize("zeros_p, zeros_q", [([], []), ([1], [4]), ([0, 5], [2])])
def test_single_draft_quadrature_is_exact(backend, zeros_p, zeros_q):
    p1, q1, p2 = dyadic(31, zeros_p), dyadic(32, zeros_q), dyadic(33, [3])
    first, bonus, total = quadrature_law(p1, q1, p2, backend)
    assert abs(total - 1.0) < QUADRATURE_ATOL
    torch.testing.assert_close(first, p1.double(), atol=QUADRATURE_ATOL, rtol=0)
    accept_prob = float(torch.minimum(p1, q1).double().sum())
    torch.testing.assert_close(bonus, accept_prob * p2.double(), atol=QUADRATURE_ATOL, rtol=0)


def test_quadrature_detects_a_wrong_rule():
    """The quadrature is sharp: accepting with u * p < q instead of u * q < p changes the law."""
    p1, q1, p2 = dyadic(31, []), dyadic(32, []), dyadic(33, [3])
    first, _, _ = quadrature_law(q1, p1, p2, "torch")  # roles swapped: law is q, not p
    assert (first - p1.double()).abs().max() > 1e-3


def test_ragged_multi_draft_monte_carlo_torch():
    out, num_drafts, p, _, _ = run_ragged("torch")
    check_ragged_law(out, num_drafts, p)


def test_monte_carlo_detects_unchecked_drafts():
    """Power check: the drafts themselves follow q, not p, and the same test rejects them."""
    out, num_drafts, p, drafts, cu = run_ragged("torch")
    first_drafts = drafts[cu[:-1][num_drafts > 0]]
    assert chi_square_p(first_drafts, mc_distributions()[1][0]) > MC_ALPHA  # they follow q
    observed = np.bincount(first_drafts.numpy(), minlength=V)
    expected = p[0].double().numpy() * observed.sum()
    support = expected > 0
    rejects = (
        observed[~support].sum() > 0
        or stats.chisquare(
            observed[support], expected[support] * observed[support].sum() / expected[support].sum()
        ).pvalue
        < MC_ALPHA
    )
    assert rejects
