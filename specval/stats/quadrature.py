"""Quadrature: the output law of one single-draft speculative step, by a dense sweep of its uniforms.

With one draft (K = 1) a step consumes three uniforms (u_draft, u_accept, u_final) in [0, 1)^3 (the
RNG protocol's block of 2K + 1); an accept kernel is handed the draft token x and maps
(x, u_accept, u_final) to its FIRST emitted token. The sweep never asks how the kernel lays out
its inverse CDFs. It has two parts of G rows each, one over the accepted volume and one over the
rejected volume of the cube:

- x is stratified, not sampled: in the accepted sweep slab x owns a share min(p, q)(x) / A of the
  rows (A = sum min(p, q) / T_q), in the rejected sweep a share max(q - p, 0)(x) / P_rej; row i
  (midpoint (i + 1/2) / G of the shares laid end to end) belongs to one slab, so each slab's
  volume is represented within 1/G (u_draft only selects x and is held at DRAFT_UNIFORM);
- u_accept is split exactly at t = min(1, p(x)/q(x)): the n rows of slab x in the accepted sweep
  sit at the midpoints of n equal parts of [0, t), those of the rejected sweep at the midpoints of
  [t, 1), so a correct kernel accepts every row of the first sweep and none of the second, while
  an accept boundary off by d at x moves about q(x)/T_q * d of mass;
- u_final is the midpoint (j + 1/2) / G with j = i * a mod G (a rank-1 lattice, a coprime with
  G): over each sweep it takes every grid value exactly once, whatever the slabs.

Every row of a sweep stands for an equal share of its volume (A / G or P_rej / G) and the
frequency of token v is compared with the exact law of the given p and q in float64:

    L(v) = min(p, q)(v) / T_q + P_rej * r(v) / R,  r = max(p - q, 0), R = sum r,
    P_rej = sum max(q - p, 0) / T_q       (if R = 0 the rejected volume is error mass).

Resolution: in the accepted sweep a correct kernel returns x on every row, and the number of
rows of slab v is within 1 of G * share, so that part of the law is within A/G. In the rejected
sweep, if the kernel's preimage of v is ONE interval of u_final of length l (any position, any
order of the vocabulary), the rows in it number within 1 of G * l: within P_rej/G. Per token the
law is within 1/G of L, plus the kernel's own rounding of l (`rounding_allowance`). A kernel with
m intervals per token (or one whose intervals move with x) needs m/G (`intervals_per_token`).
How far L itself is from p / T_p (float32 inputs do not have equal totals) is reported apart as
`law_deviation`, never folded into the tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from specval.stats import checks
from specval.stats.adversarial import ProbPair, adversarial_pairs  # noqa: F401  (re-exported)
from specval.stats.results import StatResult

# accept_fn(draft_tokens[N] int64, draft_probs[N, V], target_probs[N, V], uniforms[N, 3] float64)
#   -> first_token[N] int64. Row i is one request with one draft token; draft_probs/target_probs
#   keep the dtype of the arrays given to `sweep_law` and may be read-only broadcast views (all
#   rows equal); uniforms[:, 0] is u_draft, [:, 1] u_accept, [:, 2] u_final. A token outside
#   [0, V) (e.g. a padding or error value) counts as error mass.
AcceptFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
# draft_fn(draft_probs[N, V], u_draft[N] float64) -> draft_tokens[N] int64 (a categorical draw).
DraftFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

GRID_SIZE = 1 << 16  # G: rows per sweep (two sweeps per pair); resolution 1/G = 1.5e-5
CHUNK_ELEMENTS = 1 << 22  # rows * V per call of the implementation, bounds its memory
NUM_UNIFORMS = 3  # 2K + 1 uniforms for K = 1
DRAFT_UNIFORM = 0.5  # u_draft: not read by an accept kernel (it is handed the draft token)
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # lattice multiplier a ~ G * GOLDEN spreads the pairs evenly
ROUNDING_ULPS = 4  # kernel rounding of an interval length: <= 4 eps of the input dtype (relative)


@dataclasses.dataclass(frozen=True, eq=False)
class SweepRows:
    """All rows of the sweep for one (p, q) pair, one row per evaluation of the kernel."""

    draft_tokens: np.ndarray  # [M] int64, the draft x of the row's slab
    uniforms: np.ndarray  # [M, 3] float64, (u_draft, u_accept, u_final)
    weights: np.ndarray  # [M] float64, the volume the row stands for (sums to 1)


@dataclasses.dataclass(frozen=True, eq=False)
class QuadratureResult(StatResult):
    """The swept law of the implementation against the exact law L of the given p and q.

    `max_abs_error` = max_v |law_v - L_v| (and `error_mass` against `exact_error_mass`); `passed`
    iff both are <= `resolution` + `allowance`. `resolution` = intervals_per_token / grid_size;
    `allowance` = the caller's tol + the rounding allowance of the input dtype. `law_deviation` =
    max_v |L_v - p_v / T_p|, reported, never part of the decision. `law` and `target` (= L) [V]
    are kept as attributes but left out of `to_dict()`.
    """

    max_abs_error: float
    tv: float
    passed: bool
    num_rows: int
    grid_size: int
    resolution: float
    allowance: float
    error_mass: float
    exact_error_mass: float
    law_deviation: float
    worst_token: int
    law: np.ndarray  # [V] float64
    target: np.ndarray  # [V] float64

    _UNSERIALISED = ("law", "target")


# ---------------------------------------------------------------- the grid


def lattice_multiplier(grid_size: int) -> int:
    """The smallest a >= G * GOLDEN coprime with G: i -> i * a mod G is a permutation of the grid."""
    a = max(1, round(grid_size * GOLDEN))
    while math.gcd(a, grid_size) != 1:
        a += 1
    return a


def _midpoints(grid_size: int) -> np.ndarray:
    return (np.arange(grid_size, dtype=np.float64) + 0.5) / grid_size


def _sweep(masses: np.ndarray, low: np.ndarray, width: np.ndarray, lattice: np.ndarray) -> tuple[np.ndarray, ...]:
    """One sweep of G rows over slabs of `masses` [S] (> 0): (slab [G], u_accept [G], weight [G]).

    Row i belongs to the slab whose share of the cumulative masses holds (i + 1/2) / G; within its
    slab, u_accept is the midpoint of its rank among the slab's n rows on [low, low + width).
    """
    grid_size = lattice.size
    total = masses.sum()
    edges = np.cumsum(masses) / total
    slab = np.minimum(np.searchsorted(edges, _midpoints(grid_size), side="right"), masses.size - 1)
    counts = np.bincount(slab, minlength=masses.size)
    rank = np.arange(grid_size) - (np.cumsum(counts) - counts)[slab]
    u_accept = low[slab] + width[slab] * (rank + 0.5) / counts[slab]
    return slab, u_accept, np.full(grid_size, total / grid_size)


def _sweep_rows(p: np.ndarray, q: np.ndarray, grid_size: int) -> SweepRows:
    """The accepted and the rejected sweep of the module docstring for float64 p [V], q [V]."""
    drafts = np.flatnonzero(q > 0)
    ratio = np.minimum(1.0, p[drafts] / q[drafts])
    q_hat = q[drafts] / q.sum()
    grid = _midpoints(grid_size)
    lattice = grid[(np.arange(grid_size) * lattice_multiplier(grid_size)) % grid_size]
    parts = []
    for keep, low, width in ((ratio > 0, np.zeros_like(ratio), ratio), (ratio < 1, ratio, 1.0 - ratio)):
        if keep.any():
            slab, u_accept, weights = _sweep(q_hat[keep] * width[keep], low[keep], width[keep], lattice)
            parts.append((drafts[keep][slab], u_accept, weights))
    tokens, u_accept, weights = (np.concatenate(column) for column in zip(*parts))
    return SweepRows(
        draft_tokens=tokens.astype(np.int64),
        uniforms=np.column_stack([np.full(tokens.size, DRAFT_UNIFORM), u_accept, np.tile(lattice, len(parts))]),
        weights=weights,
    )


def _validated_pair(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays as float64 1-D weights of one length, or ValueError naming the bad one."""
    p64 = checks.as_weights("p", p)
    q64 = checks.as_weights("q", q)
    checks.same_length("p", p64, "q", q64)
    return p64, q64


def _grid_size(grid_size: int) -> int:
    return checks.count("grid_size", grid_size, minimum=1)


# ---------------------------------------------------------------- laws


def exact_law(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, float]:
    """(L [V], error mass): the exact first-token law of the single-draft rule on p and q, in float64.

    Assumptions: p, q are non-negative weights (any totals), upcast to float64 unchanged.
    Guarantee: L + error mass sums to 1 up to float64 rounding; the error mass is the rejected
    volume when max(p - q, 0) is all zero (a correct kernel flags it), else 0.
    Scaling: O(V).
    """
    p64, q64 = _validated_pair(p, q)
    total_q = q64.sum()
    residual = np.maximum(p64 - q64, 0.0)
    rejected = float(np.maximum(q64 - p64, 0.0).sum() / total_q)
    accepted = np.minimum(p64, q64) / total_q
    if residual.sum() > 0:
        return accepted + rejected * residual / residual.sum(), 0.0
    return accepted, rejected


def sweep_law(
    p: np.ndarray,
    q: np.ndarray,
    accept_fn: AcceptFn,
    *,
    grid_size: int = GRID_SIZE,
) -> tuple[np.ndarray, float, int]:
    """(law [V] float64, error_mass, num_rows): token frequencies of `accept_fn` over the sweep.

    Assumptions: `accept_fn` (signature at `AcceptFn`) is a deterministic function of its inputs.
    p and q are passed to it unchanged (same dtype); the rows are computed from their values
    upcast to float64.
    Guarantee: law + error_mass sums to 1 up to float64 rounding; for a kernel whose preimage of
    each token is one interval of u_final (any order) and whose accept test is the exact split,
    |law - L| < 1/grid_size + its own rounding, per token (module docstring).
    Scaling: num_rows <= 2 G whatever the supports; the kernel is called in chunks of
    CHUNK_ELEMENTS / V rows, so the work is 2 G V. Tokens outside supp p U supp q never change the
    law of a per-token rule: cut large vocabularies with `restrict_to_support` first.
    """
    p64, q64 = _validated_pair(p, q)
    rows = _sweep_rows(p64, q64, _grid_size(grid_size))
    tokens = _evaluate(np.asarray(p), np.asarray(q), rows, accept_fn)
    valid = (tokens >= 0) & (tokens < p64.size)
    law = np.bincount(tokens[valid], weights=rows.weights[valid], minlength=p64.size)
    return law, float(rows.weights[~valid].sum()), int(rows.weights.size)


def _evaluate(p: np.ndarray, q: np.ndarray, rows: SweepRows, accept_fn: AcceptFn) -> np.ndarray:
    """first_token [M] of `accept_fn` at every row, in bounded chunks."""
    vocab = p.shape[0]
    chunk = max(1, CHUNK_ELEMENTS // vocab)
    outputs = []
    for start in range(0, rows.weights.size, chunk):
        stop = min(start + chunk, rows.weights.size)
        first = accept_fn(
            rows.draft_tokens[start:stop],
            np.broadcast_to(q, (stop - start, vocab)),
            np.broadcast_to(p, (stop - start, vocab)),
            rows.uniforms[start:stop],
        )
        outputs.append(_as_tokens(first, stop - start))
    return np.concatenate(outputs) if outputs else np.zeros(0, dtype=np.int64)


def _as_tokens(first: object, rows: int) -> np.ndarray:
    """The implementation's output as int64 [rows], or ValueError naming the bad shape."""
    tokens = np.asarray(first)
    if tokens.shape != (rows,) or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"accept_fn must return int tokens of shape ({rows},), got dtype {tokens.dtype} shape {tokens.shape}"
        )
    return tokens.astype(np.int64)


def rounding_allowance(dtype: np.dtype | type) -> float:
    """ROUNDING_ULPS eps of `dtype`: how far a kernel's own interval lengths may be from L's.

    Why: a kernel forms max(p - q, 0) in the input dtype (relative error <= eps/2 per entry) and
    normalises it (another eps/2 on the total, in float32 at worst) before its float64 CDF, so
    each length it uses is within 2 eps * l <= 2 eps of the exact l; 4 eps leaves a factor 2.
    float32: 4.8e-7; float64: 8.9e-16. Integer or other dtypes get the float64 value.
    """
    dtype = np.dtype(dtype)
    eps = np.finfo(dtype).eps if np.issubdtype(dtype, np.floating) else np.finfo(np.float64).eps
    return float(ROUNDING_ULPS * eps)


def _compare(
    law: np.ndarray,
    error_mass: float,
    exact: tuple[np.ndarray, float],
    target_p: np.ndarray,
    num_rows: int,
    grid_size: int,
    resolution: float,
    allowance: float,
) -> QuadratureResult:
    target, exact_error = exact
    diff = np.abs(law - target)
    worst = int(np.argmax(diff))
    limit = resolution + allowance
    return QuadratureResult(
        max_abs_error=float(diff[worst]),
        tv=float(0.5 * (diff.sum() + abs(error_mass - exact_error))),
        passed=bool(diff[worst] <= limit and abs(error_mass - exact_error) <= limit),
        num_rows=num_rows,
        grid_size=grid_size,
        resolution=resolution,
        allowance=allowance,
        error_mass=error_mass,
        exact_error_mass=exact_error,
        law_deviation=float(np.abs(target - target_p / target_p.sum()).max()),
        worst_token=worst,
        law=law,
        target=target,
    )


def quadrature_check(
    p: np.ndarray,
    q: np.ndarray,
    accept_fn: AcceptFn,
    tol: float = 1e-9,
    *,
    grid_size: int = GRID_SIZE,
    intervals_per_token: int = 1,
) -> QuadratureResult:
    """Compare the swept first-token law of `accept_fn` with the exact law L of p and q.

    Assumptions: as `sweep_law`; the kernel maps u_final to each token through at most
    `intervals_per_token` intervals per slab (1 for any inverse CDF, whatever its token order).
    Guarantee: deterministic (no false-fail or false-pass probability). A correct kernel passes:
    its error is < resolution = intervals_per_token / grid_size plus its own rounding, which the
    allowance (tol + `rounding_allowance` of p's dtype) covers. A kernel whose law differs from
    L by more than resolution + allowance on any token (or in error mass) fails; an accept
    boundary off by d at x moves about q(x)/T_q * d of mass, seen when that exceeds 1/grid_size.
    Scaling: as `sweep_law`.
    """
    tol = checks.non_negative("tol", tol)
    intervals = checks.count("intervals_per_token", intervals_per_token, minimum=1)
    grid_size = _grid_size(grid_size)
    law, error_mass, num_rows = sweep_law(p, q, accept_fn, grid_size=grid_size)
    p64, _ = _validated_pair(p, q)
    return _compare(
        law,
        error_mass,
        exact_law(p, q),
        p64,
        num_rows,
        grid_size,
        intervals / grid_size,
        tol + rounding_allowance(np.asarray(p).dtype),
    )


def draft_law(q: np.ndarray, draft_fn: DraftFn, *, grid_size: int = GRID_SIZE) -> np.ndarray:
    """Frequencies [V] of the drafted token over the G midpoints of u_draft (any CDF order).

    Assumptions: `draft_fn` (signature at `DraftFn`) is deterministic. Guarantee: sums to 1 minus
    the mass of invalid tokens; an inverse CDF with one interval per token is within 1/G of
    q / T_q per token. Scaling: grid_size rows, in chunks of CHUNK_ELEMENTS / V.
    """
    q64 = checks.as_weights("q", q)
    grid = _midpoints(_grid_size(grid_size))
    chunk = max(1, CHUNK_ELEMENTS // q64.size)
    drawn = np.concatenate(
        [
            _as_tokens(draft_fn(np.broadcast_to(np.asarray(q), (len(part), q64.size)), part), len(part))
            for part in np.split(grid, range(chunk, grid.size, chunk))
        ]
    )
    valid = (drawn >= 0) & (drawn < q64.size)
    return np.bincount(drawn[valid], minlength=q64.size) / grid.size


def draft_quadrature_check(
    q: np.ndarray, draft_fn: DraftFn, tol: float = 1e-9, *, grid_size: int = GRID_SIZE
) -> QuadratureResult:
    """Compare the swept law of the drafted token with q / T_q (the DRAFTED-token variant).

    Guarantee: deterministic; a correct inverse-CDF draw (any order) is within 1/grid_size plus
    its rounding; a draw whose law differs from q / T_q by more than that fails.
    Scaling: grid_size calls' worth of rows.
    """
    tol = checks.non_negative("tol", tol)
    grid_size = _grid_size(grid_size)
    law = draft_law(q, draft_fn, grid_size=grid_size)
    q64 = checks.as_weights("q", q)
    error_mass = float(max(0.0, 1.0 - law.sum()))
    return _compare(
        law,
        error_mass,
        (q64 / q64.sum(), 0.0),
        q64,
        grid_size,
        grid_size,
        1.0 / grid_size,
        tol + rounding_allowance(np.asarray(q).dtype),
    )


def restrict_to_support(p: np.ndarray, q: np.ndarray, num_zero: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p[tokens], q[tokens], tokens): tokens = supp p U supp q and the first `num_zero` tokens
    outside both supports (zero entries stay exercised), in vocabulary order.

    For a rule that treats tokens one by one (as the single-draft rule does) the law on these
    tokens is unchanged and every other token has probability 0, while the sweep's work
    (num_rows * V) shrinks with V. Caveat: a bug that only shows with many zero entries present
    (e.g. an indexing error far beyond the support) is not exercised on the restricted pair.
    """
    p_arr, q_arr = np.asarray(p), np.asarray(q)
    _validated_pair(p_arr, q_arr)
    inside = (p_arr > 0) | (q_arr > 0)
    zeros = np.flatnonzero(~inside)[: checks.count("num_zero", num_zero)]
    tokens = np.union1d(np.flatnonzero(inside), zeros)
    return p_arr[tokens], q_arr[tokens], tokens


# ---------------------------------------------------------------- the stop point


STOP_POINT_VOCAB = 8  # the stop-point case is per token: a small vocabulary shows it
STOP_POINT_TOKEN = 0  # the draft token, the one token the target forbids
STOP_POINT_UNIFORMS = (DRAFT_UNIFORM, 0.0, 0.5)  # u_accept = 0: the one point a sweep never reaches


def stop_point_case(dtype: np.dtype | type) -> tuple[np.ndarray, np.ndarray]:
    """(p [V], q [V]) in `dtype`: q uniform, p uniform on every token but STOP_POINT_TOKEN (p = 0)."""
    q = np.full(STOP_POINT_VOCAB, 1.0 / STOP_POINT_VOCAB)
    p = np.full(STOP_POINT_VOCAB, 1.0 / (STOP_POINT_VOCAB - 1))
    p[STOP_POINT_TOKEN] = 0.0
    return p.astype(dtype), q.astype(dtype)


def stop_point_token(accept_fn: AcceptFn, dtype: np.dtype | type) -> int:
    """The first token `accept_fn` emits for the stop-point case at u_accept = 0."""
    p, q = stop_point_case(dtype)
    first = accept_fn(
        np.array([STOP_POINT_TOKEN], dtype=np.int64),
        q[None, :],
        p[None, :],
        np.array([STOP_POINT_UNIFORMS], dtype=np.float64),
    )
    return int(_as_tokens(first, 1)[0])


def stop_point_passed(p: np.ndarray, first_token: int) -> bool:
    """True iff the token emitted at the stop point is a valid token of positive target probability.

    The contract: accept iff u * q(x) < p(x), so a draft with p(x) = 0 is rejected even at
    u_accept = 0 and the correction is drawn from max(p - q, 0), never x. The sweep integrates
    over u_accept and cannot see one point; this check can (`accept_le`, u * q <= p, fails it).
    Deterministic.
    """
    p64 = checks.as_weights("p", p)
    return bool(0 <= first_token < p64.size and first_token != STOP_POINT_TOKEN and p64[first_token] > 0)
