"""Quadrature: the exact output law of one single-draft speculative step, by cell enumeration.

With one draft (K = 1) a step consumes three uniforms u = (u_draft, u_accept, u_final) in [0, 1)^3
(the RNG protocol's block of 2K + 1) and its FIRST emitted token is a piecewise-constant function
of u:

- u_draft picks the draft x = categorical(q, u_draft): x is constant on [C_{x-1}, C_x) / T_q, with
  C the float64 CDF of q and T_q its total;
- u_accept accepts x iff u_accept * q(x) < p(x): constant on [0, t) and [t, 1), t = min(1, p(x)/q(x));
- after an accept the first token is x whatever u_final is (u_final only draws the bonus token
  that follows it); after a rejection it is categorical(max(p - q, 0), u_final), constant on the
  intervals of the residual's CDF.

Evaluating the implementation once at an interior point (the midpoint) of every cell and
weighting by the cell's volume therefore gives the implementation's exact law of the first token,
up to float64 rounding of the cell volumes, with no Monte Carlo error at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from specval.stats import checks
from specval.stats.adversarial import ProbPair, adversarial_pairs  # noqa: F401  (re-exported)
from specval.stats.results import StatResult

# accept_fn(draft_tokens[N] int64, draft_probs[N, V], target_probs[N, V], uniforms[N, 3] float64)
#   -> first_token[N] int64. Row i is one request with one draft token; draft_probs/target_probs
#   keep the dtype of the arrays given to `single_draft_law` and may be read-only broadcast views
#   (all rows equal); uniforms[:, 0] is u_draft, [:, 1] u_accept, [:, 2] u_final. A token outside
#   [0, V) (e.g. a padding or error value) counts as error mass.
AcceptFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
# draft_fn(draft_probs[N, V], u_draft[N] float64) -> draft_tokens[N] int64 (a categorical draw).
DraftFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

CHUNK_ELEMENTS = 1 << 22  # rows * V per call of the implementation, bounds its memory
NUM_UNIFORMS = 3  # 2K + 1 uniforms for K = 1
MIDPOINT = 0.5  # the interior point of a uniform whose value cannot change the first token
DEFAULT_MAX_CELLS = 20_000_000  # refuse larger enumerations (pass max_cells=None to lift it)


@dataclasses.dataclass(frozen=True, eq=False)
class Cells:
    """All cells of the unit cube for one (p, q) pair, one row per cell."""

    draft_tokens: np.ndarray  # [M] int64, the draft x of the cell
    uniforms: np.ndarray  # [M, 3] float64, the cell's midpoint
    volumes: np.ndarray  # [M] float64, the cell's volume (sums to 1)


@dataclasses.dataclass(frozen=True, eq=False)
class QuadratureResult(StatResult):
    """Exact law of the implementation against the analytic target.

    `max_abs_error` = max_v |law_v - target_v|; `tv` = total variation including `error_mass`
    (volume on which the implementation returned no valid token); `passed` iff both
    `max_abs_error` and `error_mass` are <= `tolerance` + `normalisation_slack`.
    `law` and `target` [V] are kept as attributes but left out of `to_dict()`.
    """

    max_abs_error: float
    tv: float
    passed: bool
    num_cells: int
    tolerance: float
    normalisation_slack: float
    error_mass: float
    worst_token: int
    law: np.ndarray  # [V] float64
    target: np.ndarray  # [V] float64

    _UNSERIALISED = ("law", "target")


def _intervals(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens of positive-width CDF intervals of `weights`, their midpoints and widths in [0, 1)."""
    upper = np.cumsum(weights)
    lower = np.concatenate([[0.0], upper[:-1]])
    total = upper[-1]
    tokens = np.flatnonzero((weights > 0) & (upper > lower))
    return tokens, (lower[tokens] + upper[tokens]) / (2 * total), (upper[tokens] - lower[tokens]) / total


def _single_draft_cells(p: np.ndarray, q: np.ndarray, max_cells: int | None) -> Cells:
    """Enumerate the cells of the module docstring for float64 p [V], q [V].

    The number of cells is counted, and checked against `max_cells`, before anything is built.
    """
    drafts, u_draft, w_draft = _intervals(q)
    ratio = np.minimum(1.0, p[drafts] / q[drafts])
    residual = np.maximum(p - q, 0.0)
    if residual.sum() > 0:
        _, u_res, w_res = _intervals(residual)
    else:  # only reachable when p and q have different totals: the implementation must flag it
        u_res, w_res = np.array([MIDPOINT]), np.array([1.0])
    acc, rej, reps = ratio > 0, ratio < 1, len(u_res)
    _num_cells_allowed(int(acc.sum()) + int(rej.sum()) * reps, max_cells)
    # Accepted cells: [0, t) in u_accept; u_final is free (it only draws the bonus token).
    acc_uniforms = np.column_stack([u_draft[acc], ratio[acc] / 2, np.full(acc.sum(), MIDPOINT)])
    # Rejected cells: [t, 1) in u_accept, times every interval of the residual's CDF.
    rej_uniforms = np.column_stack([
        np.repeat(u_draft[rej], reps),
        np.repeat((1 + ratio[rej]) / 2, reps),
        np.tile(u_res, rej.sum()),
    ])
    return Cells(
        draft_tokens=np.concatenate([drafts[acc], np.repeat(drafts[rej], reps)]).astype(np.int64),
        uniforms=np.concatenate([acc_uniforms, rej_uniforms]).reshape(-1, NUM_UNIFORMS),
        volumes=np.concatenate([
            w_draft[acc] * ratio[acc],
            np.outer(w_draft[rej] * (1 - ratio[rej]), w_res).ravel(),
        ]),
    )


def _validated_pair(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays as float64 1-D weights of one length, or ValueError naming the bad one."""
    p64 = checks.as_weights("p", p)
    q64 = checks.as_weights("q", q)
    checks.same_length("p", p64, "q", q64)
    return p64, q64


def _num_cells_allowed(num_cells: int, max_cells: int | None) -> None:
    if max_cells is not None and num_cells > max_cells:
        raise ValueError(f"max_cells = {max_cells} is below the {num_cells} cells this pair needs; "
                         f"raise max_cells, or restrict p and q to the union of their supports")


def single_draft_law(
    p: np.ndarray, q: np.ndarray, accept_fn: AcceptFn, *, max_cells: int | None = DEFAULT_MAX_CELLS
) -> tuple[np.ndarray, float, int]:
    """Exact law of the first emitted token of `accept_fn` for target p [V] and draft q [V].

    Returns (law [V] float64, error_mass, num_cells): law_v is the volume of the cells on which
    `accept_fn` returned v; error_mass is the volume on which it returned no token in [0, V).
    Assumptions: `accept_fn` (signature at `AcceptFn`) is a deterministic function of its
    uniforms that is constant on every cell of the module docstring (true of any implementation
    of the single-draft rule; a bug that breaks the piecewise structure can hide between
    midpoints). p and q are passed to it unchanged (same dtype), the cells are computed from
    their values upcast to float64.
    Guarantee: law + error_mass sums to 1 up to float64 rounding (~1e-15 for V <= 1e4).
    Scaling: num_cells <= |supp q| * (1 + |supp max(p - q, 0)|); `accept_fn` is called in
    chunks of CHUNK_ELEMENTS / V rows, so the work is num_cells * V; `max_cells` (None: no limit)
    refuses pairs that need more cells, before anything is allocated. Tokens outside
    supp p U supp q never change the law of a per-token rule, so a large vocabulary can be cut
    to that union first.
    """
    p64, q64 = _validated_pair(p, q)
    cells = _single_draft_cells(p64, q64, max_cells)
    num_cells = int(cells.volumes.size)
    tokens = _evaluate(np.asarray(p), np.asarray(q), cells, accept_fn)
    valid = (tokens >= 0) & (tokens < p64.size)
    law = np.bincount(tokens[valid], weights=cells.volumes[valid], minlength=p64.size)
    return law, float(cells.volumes[~valid].sum()), num_cells


def _evaluate(p: np.ndarray, q: np.ndarray, cells: Cells, accept_fn: AcceptFn) -> np.ndarray:
    """first_token [M] of `accept_fn` at every cell midpoint, in bounded chunks."""
    vocab = p.shape[0]
    chunk = max(1, CHUNK_ELEMENTS // vocab)
    outputs = []
    for start in range(0, cells.volumes.size, chunk):
        stop = min(start + chunk, cells.volumes.size)
        rows = stop - start
        first = accept_fn(
            cells.draft_tokens[start:stop],
            np.broadcast_to(q, (rows, vocab)),
            np.broadcast_to(p, (rows, vocab)),
            cells.uniforms[start:stop],
        )
        outputs.append(_as_tokens(first, rows))
    return np.concatenate(outputs) if outputs else np.zeros(0, dtype=np.int64)


def _as_tokens(first: object, rows: int) -> np.ndarray:
    """The accept function's output as int64 [rows], or ValueError naming the bad shape."""
    tokens = np.asarray(first)
    if tokens.shape != (rows,) or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"accept_fn must return int tokens of shape ({rows},), got "
                         f"dtype {tokens.dtype} shape {tokens.shape}")
    return tokens.astype(np.int64)


def draft_law(q: np.ndarray, draft_fn: DraftFn) -> np.ndarray:
    """Exact law [V] of the drafted token: `draft_fn` at the midpoint of each CDF interval of q.

    Assumptions: `draft_fn` (signature at `DraftFn`) is an inverse-CDF draw, constant on the
    intervals of q's float64 CDF. Guarantee: sums to 1 minus the mass of invalid tokens.
    Scaling: one call with |supp q| rows.
    """
    q64 = checks.as_weights("q", q)
    tokens, u_draft, widths = _intervals(q64)
    rows = tokens.size
    drawn = _as_tokens(draft_fn(np.broadcast_to(np.asarray(q), (rows, q64.size)), u_draft), rows)
    valid = (drawn >= 0) & (drawn < q64.size)
    return np.bincount(drawn[valid], weights=widths[valid], minlength=q64.size)


def normalisation_slack(p: np.ndarray, q: np.ndarray) -> float:
    """|T_p - T_q| / T_q: the largest error a CORRECT single-draft step can show against p / T_p.

    Why: with raw totals the exact law is [min(p, q) + (S_q / S_p) max(p - q, 0)] / T_q, where
    S_p = sum max(p - q, 0) and S_q = sum max(q - p, 0) = S_p + T_q - T_p; its distance from
    p / T_p is (T_q - T_p) / T_q * (max(p - q, 0) / S_p - p / T_p) per token, bounded by the
    slack. It is 0 when both totals are equal (e.g. float64 inputs normalised alike) and about
    1e-7 for independently normalised float32 rows.
    """
    p64, q64 = _validated_pair(p, q)
    return float(abs(p64.sum() - q64.sum()) / q64.sum())


def _compare(law: np.ndarray, target: np.ndarray, error_mass: float, num_cells: int,
             tol: float, slack: float) -> QuadratureResult:
    diff = np.abs(law - target)
    worst = int(np.argmax(diff))
    limit = tol + slack
    return QuadratureResult(
        max_abs_error=float(diff[worst]),
        tv=float(0.5 * (diff.sum() + error_mass)),
        passed=bool(diff[worst] <= limit and error_mass <= limit),
        num_cells=num_cells,
        tolerance=float(tol),
        normalisation_slack=slack,
        error_mass=error_mass,
        worst_token=worst,
        law=law,
        target=target,
    )


def quadrature_check(
    p: np.ndarray, q: np.ndarray, accept_fn: AcceptFn, tol: float = 1e-9, *,
    max_cells: int | None = DEFAULT_MAX_CELLS,
) -> QuadratureResult:
    """Compare the exact first-token law of `accept_fn` with the analytic target p / T_p.

    The target is p normalised in float64 from the same float values the implementation sees.
    Assumptions: as `single_draft_law`.
    Guarantee: a correct implementation passes (its error is float64 rounding, far below `tol`,
    plus at most `normalisation_slack(p, q)`, which the limit includes); an implementation
    whose law differs from the target by more than tol + slack on any token fails, with no
    false-fail or false-pass probability (the check is deterministic, not statistical).
    Scaling: as `single_draft_law`.
    """
    tol = checks.non_negative("tol", tol)
    law, error_mass, num_cells = single_draft_law(p, q, accept_fn, max_cells=max_cells)
    p64 = checks.as_weights("p", p)
    return _compare(law, p64 / p64.sum(), error_mass, num_cells, tol, normalisation_slack(p, q))


def draft_quadrature_check(q: np.ndarray, draft_fn: DraftFn, tol: float = 1e-9) -> QuadratureResult:
    """Compare the exact law of the drafted token with q / T_q (the DRAFTED-token variant).

    Guarantee: deterministic; a correct inverse-CDF draw passes with error ~1e-16; a draw whose
    law differs from q / T_q by more than `tol` on any token fails.
    Scaling: one call of `draft_fn` with |supp q| rows.
    """
    tol = checks.non_negative("tol", tol)
    law = draft_law(q, draft_fn)
    q64 = checks.as_weights("q", q)
    error_mass = float(max(0.0, 1.0 - law.sum()))
    num_cells = int(np.count_nonzero(q64))
    return _compare(law, q64 / q64.sum(), error_mass, num_cells, tol, 0.0)


def restrict_to_support(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p[tokens], q[tokens], tokens) with tokens = supp p U supp q, in vocabulary order.

    For a rule that treats tokens one by one (as the single-draft rule does) the law on these
    tokens is unchanged and every other token has probability 0, while the quadrature's work
    (num_cells * V) shrinks with V. Caveat: a bug that only shows with the zero entries present
    (e.g. an indexing error beyond the support) is not exercised on the restricted pair.
    """
    p_arr, q_arr = np.asarray(p), np.asarray(q)
    _validated_pair(p_arr, q_arr)
    tokens = np.flatnonzero((p_arr > 0) | (q_arr > 0))
    return p_arr[tokens], q_arr[tokens], tokens


def _require_float32(name: str, array: np.ndarray) -> None:
    """The engine takes float32 probabilities: refuse other dtypes instead of rounding silently,
    because the cells are computed from the values given and must match what the engine sees."""
    if array.dtype != np.float32:
        raise ValueError(f"{name} must be float32 for the engine adapter (cast p and q before "
                         f"calling quadrature_check), got {array.dtype}")


def _tensor(array: np.ndarray, dtype: type, device: str):  # -> torch.Tensor
    """A writable contiguous copy of `array` (possibly a read-only broadcast view) on `device`."""
    import torch

    return torch.from_numpy(np.array(array, dtype=dtype, order="C")).to(device)


def engine_accept_fn(*, backend: str = "torch", device: str = "cpu") -> AcceptFn:
    """An `AcceptFn` running `engine.sampling.speculative_accept` with K = 1 on every cell.

    Each cell is one random request with one draft: cu_num_drafts = 0, 1, ..., N; its two target
    rows (the draft position and the bonus position) are both p; the first emitted token is
    tokens[:, 0], PLACEHOLDER_TOKEN (an error) counting as error mass. p and q must be float32.
    The engine is imported when this is called, never when this module is imported.
    """
    import torch

    from engine.sampling import speculative_accept

    def accept(draft_tokens: np.ndarray, draft_probs: np.ndarray, target_probs: np.ndarray,
               uniforms: np.ndarray) -> np.ndarray:
        _require_float32("draft_probs", draft_probs)
        _require_float32("target_probs", target_probs)
        rows, vocab = target_probs.shape
        p = _tensor(target_probs, np.float32, device)
        result = speculative_accept(
            _tensor(draft_tokens, np.int64, device),
            torch.arange(rows + 1, dtype=torch.int64, device=device),
            _tensor(draft_probs, np.float32, device),
            p.unsqueeze(1).expand(rows, 2, vocab).reshape(2 * rows, vocab).contiguous(),
            _tensor(uniforms, np.float64, device),
            torch.zeros(rows, dtype=torch.bool, device=device),
            backend=backend,
        )
        return result.tokens[:, 0].cpu().numpy()

    return accept


def engine_draft_fn(*, backend: str = "torch", device: str = "cpu") -> DraftFn:
    """A `DraftFn` running `engine.sampling.categorical` (imported when called); q must be float32."""
    import torch

    from engine.sampling import categorical

    def draft(draft_probs: np.ndarray, u_draft: np.ndarray) -> np.ndarray:
        _require_float32("draft_probs", draft_probs)
        weights = _tensor(draft_probs, np.float32, device)
        return categorical(weights, _tensor(u_draft, np.float64, device), backend=backend).cpu().numpy()

    return draft
