"""categorical: float64 inverse CDF, always a positive-weight token, -1 for invalid rows.

Expected tokens come from an exact rational-arithmetic inverse CDF (fractions.Fraction), an
implementation independent of both backends.
"""

from fractions import Fraction

import pytest
import torch

from engine.sampling import INVALID_ROW, categorical
from tests.fixtures.sampling_helpers import generator

BELOW_ONE = float(torch.nextafter(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0)))


def exact_draw(weights: list[float], u: float) -> int:
    """First j with w_j > 0 and cdf_j > u * total (last positive if none).

    As specified, u * total is a float64 product; the CDF is summed exactly here, so the
    backends (float64 sums) can disagree only if a CDF value lies within ~1e-16 relative of
    u * total: probability ~1e-13 per draw for the random rows below.
    """
    w = [Fraction(x) for x in weights]
    target, cdf = Fraction(u * float(sum(w))), Fraction(0)
    for j, wj in enumerate(w):
        cdf += wj
        if wj > 0 and cdf > target:
            return j
    return max(j for j, wj in enumerate(w) if wj > 0)


def draw(weights, us, backend, dtype=torch.float64):
    w = torch.tensor(weights, dtype=dtype)
    return categorical(w, torch.tensor(us, dtype=torch.float64), backend=backend).tolist()


def test_edges_of_u_and_zero_weights(backend):
    """u = 0 and u = nextafter(1, 0) with zero weights at both ends and in the middle."""
    row = [0.0, 0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0]
    got = draw([row] * 4, [0.0, BELOW_ONE, 0.5, 1 / 3], backend)
    assert got == [exact_draw(row, u) for u in (0.0, BELOW_ONE, 0.5, 1 / 3)]
    assert got[:3] == [2, 5, 5]  # first positive, last positive, and never a zero weight


def test_single_positive_weight(backend):
    row = [0.0] * 37 + [0.25] + [0.0] * 5
    assert draw([row] * 3, [0.0, 0.5, BELOW_ONE], backend) == [37, 37, 37]


def test_denormal_and_unnormalised_weights(backend):
    rows = [[1e-310, 0.0, 3e-310, 0.0], [2.0, 6.0, 0.0, 0.0]]
    us = [0.3, 0.3]
    assert draw(rows, us, backend) == [exact_draw(r, u) for r, u in zip(rows, us)] == [2, 1]
    f32 = draw([[1e-40, 0.0, 1e-40, 0.0]], [0.75], backend, dtype=torch.float32)
    assert f32 == [2]


def test_float64_cdf_where_float32_would_differ(backend):
    """Tiny weights after a large one: a float32 CDF never moves past 1.0 and picks index 0."""
    row = torch.tensor([1.0] + [1e-8] * 2000, dtype=torch.float32).tolist()  # float32 values
    u = 1.0000125 / (1.0 + 2000e-8)  # lands in the middle of the tail
    expected = exact_draw(row, u)
    f32_cdf = torch.cumsum(torch.tensor(row, dtype=torch.float32), 0)
    assert int(torch.nonzero(f32_cdf > u * f32_cdf[-1])[0]) != expected  # the trap is real
    assert draw([row], [u], backend, dtype=torch.float32) == [expected]


def test_matches_exact_inverse_cdf_on_random_rows(backend):
    w = torch.rand(12, 97, generator=generator(11), dtype=torch.float64)
    w[w < 0.6] = 0.0
    u = torch.rand(12, generator=generator(12), dtype=torch.float64)
    got = categorical(w, u, backend=backend).tolist()
    assert got == [exact_draw(w[i].tolist(), float(u[i])) for i in range(12)]


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf"), -1.0])
def test_invalid_rows_give_minus_one(backend, bad):
    rows = [[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]
    rows[0][1] = bad
    assert draw(rows, [0.5, 0.5], backend) == [INVALID_ROW, exact_draw(rows[1], 0.5)]


def test_inputs_not_modified_and_bad_arguments(backend):
    w = torch.rand(3, 10, generator=generator(13))
    u = torch.rand(3, generator=generator(14), dtype=torch.float64)
    w0, u0 = w.clone(), u.clone()
    categorical(w, u, backend=backend)
    assert torch.equal(w, w0) and torch.equal(u, u0)
    with pytest.raises(ValueError, match="u has dtype"):
        categorical(w, u.float(), backend=backend)
    with pytest.raises(ValueError, match="u has 2 elements"):
        categorical(w, u[:2], backend=backend)
    with pytest.raises(ValueError, match="weights has dtype"):
        categorical(w.long(), u, backend=backend)
