"""Helpers of the sampling tests (a uniquely named module: `conftest` names collide across test
folders when several are collected in one run).

`assert_row_matches_float64` is the one comparison of a float32 sampling distribution with the
exact (float64) one. Its rounding analysis, for a float32 implementation that computes
pi_j = exp(x_j - m) / Z over the survivors of top-k (x = logits / T in float32, m the max):

- top-k: the cut compares float32 x values, and every implementation computes x by one
  correctly rounded IEEE division, so a top-k cut has no rounding band: supports must agree.
- top-p: a token is kept iff the mass of strictly larger x is < p. The float32 mass of a prefix
  of the sorted survivors differs from the float64 mass by a relative error of at most
    2 * (2u * G + e_exp + 3u)     x - m rounded (u |x - m|), exp, a chunk rescale, in the
                                   prefix and in Z (G = mean of m - x under pi bounds both: the
                                   prefix holds the largest x);
  + 2 * SUM_LAMBDA * sqrt(n) * u  the prefix and Z, each a float32 sum of <= n positive terms
                                   in any order (probabilistic bound of Higham & Mary 2019,
                                   Thm 4.8: exceeded with probability <= n * 2 exp(-LAMBDA^2/2),
                                   4e-9 at n = 152,064, LAMBDA = 8);
  + 2u                            the division by Z;
  with u = 2**-24 and e_exp = `ExpError.constant` (2u: exp within 1 ulp on the CPU) plus
  `ExpError.per_gap * |x - m|` where the exp is an approximation whose error grows with its
  argument (`GPU_EXP`). A float64 prefix
  sum of float32 terms adds <= n * 2**-53 (< 2e-11), below every other term. So a token whose
  exact strictly-larger mass lies within `band = p * relative_error` of p may be kept or dropped;
  a disagreement anywhere else is a bug.
- values: on the implementation's own support, each value differs from the float64 softmax over
  that support by at most v * (u |x - m| + e_exp + 2u) + v * (2u G + e_exp + 3u + LAMBDA sqrt(n) u)
  (its own term, then Z), so no renormalisation and no tolerance picked from a passing run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.params import SamplingParams
from engine.sampling.backend import triton_can_run_on
from engine.sampling.reference import top_k_mask

__all__ = ["CPU_EXP", "GPU_EXP", "CutReport", "ExpError", "assert_row_matches_float64",
           "generator", "triton_can_run_on"]

UNIT_ROUNDOFF = 2.0**-24  # float32, round to nearest
EXP_ERROR = 2 * UNIT_ROUNDOFF  # exp within 1 ulp: glibc, Sleef (u10), numpy, the interpreter
SUM_LAMBDA = 8.0  # confidence of the probabilistic summation bound (see the module docstring)


@dataclass(frozen=True)
class ExpError:
    """Relative error of a float32 exp(t), t <= 0: at most `constant + per_gap * |t|`."""

    constant: float = EXP_ERROR
    per_gap: float = 0.0


CPU_EXP = ExpError()
# tl.exp on CUDA is the fast exp of the hardware; CUDA's documented bound for that intrinsic
# (__expf) is 2 + floor(|1.173 t|) ulp, and 1 ulp <= 2u relative. The chunk sums' exp
# (`ex2.approx.ftz`, `probabilities_kernel._exp_sum`) is the same instruction for t >= -87.3 and
# 0 below: an absolute error < 2**-126 per term, V * 2**-126 < 1e-32 of a Z >= 1 in all, far
# below every bound here.
GPU_EXP = ExpError(constant=4 * UNIT_ROUNDOFF, per_gap=1.173 * 2 * UNIT_ROUNDOFF)


def generator(seed: int) -> torch.Generator:
    """A CPU generator with a fixed seed, so every random input is reproducible."""
    return torch.Generator().manual_seed(seed)


@dataclass(frozen=True)
class CutReport:
    """What one row's comparison found at its top-p cut."""

    num_in_band: int  # survivors whose exact strictly-larger mass is within `band` of p
    num_disagreeing: int  # tokens the implementation kept and float64 dropped, or vice versa
    band: float  # absolute mass band around p (0 without top-p)


@dataclass(frozen=True)
class Float64Row:
    """The exact sampling distribution of one row, decided on the float32 x of the engine."""

    x: torch.Tensor  # [V] float32 scaled logits
    survivors: torch.Tensor  # [V] bool, top-k survivors
    mass_above: torch.Tensor  # [V] float64, mass (over survivors) of strictly larger x
    keep: torch.Tensor  # [V] bool, the exact support
    mean_gap: float  # G = E_pi[m - x] over the survivors
    num_survivors: int


def scaled_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """x = float32 logits / T by one IEEE division, as every backend computes it."""
    return logits.float() / torch.tensor(params.temperature, dtype=torch.float32)


def _softmax64(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.where(mask, x.double(), float("-inf")), 0)


def float64_row(logits: torch.Tensor, params: SamplingParams) -> Float64Row:
    """Exact top-k / top-p support of one random-sampling row (masses summed in float64)."""
    x = scaled_logits(logits, params)
    survivors = top_k_mask(x, params.top_k)
    probs = _softmax64(x, survivors)
    desc = torch.sort(x, descending=True)
    before = torch.cat([probs.new_zeros(1), torch.cumsum(probs[desc.indices], 0)])
    mass_above = before[torch.searchsorted(-desc.values, -x)]
    keep = survivors & (mass_above < params.top_p) if params.top_p < 1.0 else survivors
    weighted = probs > 0  # finite survivors; -inf logits carry no mass and no rounding
    gaps = torch.where(weighted, x.max().double() - x.double(), 0.0)
    return Float64Row(x, survivors, mass_above, keep, float((probs * gaps).sum()),
                      int(weighted.sum()))


def _relative_terms(row: Float64Row, exp: ExpError) -> tuple[float, float]:
    """(per-term relative error of a float32 sum's terms, summation error) of the analysis."""
    u = UNIT_ROUNDOFF
    term = 2 * u * row.mean_gap + exp.constant + exp.per_gap * row.mean_gap + 3 * u
    return term, SUM_LAMBDA * math.sqrt(row.num_survivors) * u


def top_p_band(row: Float64Row, top_p: float, exp: ExpError) -> float:
    """Absolute mass band around p within which float32 rounding may move a top-p decision."""
    if top_p >= 1.0:
        return 0.0
    term, summation = _relative_terms(row, exp)
    return top_p * (2 * term + 2 * summation + 2 * UNIT_ROUNDOFF)


UNDERFLOW = 2 * torch.finfo(torch.float32).tiny  # float32 exp results below ~tiny flush to 0 (GPU: FTZ)


def _underflows(row: Float64Row) -> torch.Tensor:
    """Kept tokens whose float32 value may be exactly 0 by underflow, not by a wrong cut: exp(x - max)
    or the normalised probability lies below twice float32's smallest normal (the factor 2 covers
    the exp's relative error). Their exact mass is below V * UNDERFLOW, far under any tolerance."""
    x = row.x.double()
    probs = _softmax64(row.x, row.keep)
    return row.keep & ((torch.exp(x - x.max()) < UNDERFLOW) | (probs < UNDERFLOW))


def _assert_values(out: torch.Tensor, row: Float64Row, exp: ExpError, label: str) -> None:
    """Kept values vs the float64 softmax over the same support, per element (see module doc)."""
    kept = out > 0
    assert kept.any(), f"{label}: no token kept"
    expected = _softmax64(row.x, kept)
    term, summation = _relative_terms(row, exp)
    gap = torch.where(kept, row.x[kept].max().double() - row.x.double(), 0.0)
    own = UNIT_ROUNDOFF * gap + exp.constant + exp.per_gap * gap + 2 * UNIT_ROUNDOFF
    # + UNDERFLOW: values below float32's smallest normal are denormal (absolute spacing 2**-149) or
    # flushed, so their relative error is unbounded while their absolute error stays below UNDERFLOW.
    bound = torch.where(kept, expected * (own + term + summation) + UNDERFLOW, 0.0)
    excess = (out.double() - expected).abs() - bound
    assert (excess <= 0).all(), (
        f"{label}: value off by more than the float32 bound at token {int(excess.argmax())} "
        f"({float(out[excess.argmax()])} vs {float(expected[excess.argmax()])})")


def _assert_greedy(out: torch.Tensor, logits: torch.Tensor, label: str) -> CutReport:
    expected = torch.zeros_like(out)
    expected[int(torch.argmax(logits.float()))] = 1.0
    assert torch.equal(out, expected), f"{label}: greedy row is not the argmax one-hot"
    return CutReport(0, 0, 0.0)


def assert_row_matches_float64(out: torch.Tensor, logits: torch.Tensor, params: SamplingParams, *,
                               exp: ExpError = CPU_EXP, label: str = "") -> CutReport:
    """Check one float32 row `out` [V] against the exact distribution of `logits` under `params`.

    Passes iff: greedy rows are the exact argmax one-hot; every token where `out`'s support and
    the float64 support differ has an exact strictly-larger mass within `top_p_band` of p (none
    for a top-k cut); every kept value is within the float32 bound of the float64 softmax over
    `out`'s own support. Prints and returns how many tokens lay in the band and disagreed.
    `exp`: the error of the implementation's exp (`CPU_EXP`, `GPU_EXP`).
    """
    label = f"{label} (T={params.temperature:g} k={params.top_k} p={params.top_p:g})".lstrip()
    if params.is_greedy:
        return _assert_greedy(out, logits, label)
    row = float64_row(logits, params)
    band = top_p_band(row, params.top_p, exp)
    in_band = row.survivors & ((row.mass_above - params.top_p).abs() <= band)
    differ = ((out > 0) != row.keep) & ~_underflows(row)
    outside = differ & ~in_band
    report = CutReport(int(in_band.sum()), int(differ.sum()), band)
    print(f"{label}: {report.num_disagreeing} tokens disagree with float64 at the cut, "
          f"{report.num_in_band} lie within the float32 band {band:.2e} of p")
    assert not outside.any(), (
        f"{label}: support differs from float64 at {int(outside.sum())} tokens outside the "
        f"float32 band {band:.2e} of p (e.g. token {int(outside.nonzero()[0])}, exact mass above "
        f"{float(row.mass_above[outside][0]):.9f}); {report.num_in_band} tokens in the band")
    _assert_values(out, row, exp, label)
    return report
