"""Monte Carlo p-values: exact-size tests by simulating the statistic under the known null.

The rule (Besag and Clifford's sequential Monte Carlo p-value, drawn in batches):

- draw null statistics T*_1, T*_2, ... one after the other (in vectorised batches, but counted in
  draw order);
- stop at the `EXCEEDANCES`-th draw L with T*_L >= T: p = EXCEEDANCES / L;
- or after `num_draws(level)` draws with k < EXCEEDANCES exceedances: p = (k + 1) / (B + 1).

Guarantee (any B and h): under H0, P(p <= a) <= a for every a, so a criterion tested at level t
has false-fail rate <= t exactly, not up to an asymptotic approximation. The rule for B: the
criterion's smallest level t (its Holm first step, alpha / m) fixes B = ceil(h / t), so that
p <= t iff fewer than h exceedances occur in about h / t draws; an exact p-value <= t / 2 is then
rejected with probability >= `binom.cdf(h - 1, B, t / 2)` = 0.9996 at h = 30 (`decision_power`),
so the minimum detectable effect is computed at level t / 2 (`DECISION_LEVEL_FACTOR`) and at
power / decision_power. Cost under H0: about h (1 + ln(B / h)) draws (~250 at t = 1.25e-3); a
rejected criterion costs B draws.

Early rejection (`EARLY_REJECTION`, the rule of new sequence analyses; `BESAG_CLIFFORD`, the rule
above alone, stays for the other kinds and for bundles that record it). Besag-Clifford alone cannot
reject before its cap: a rejected criterion draws all B = h / t nulls. The early rule splits the
criterion's level t in two, spent = `EARLY_SHARE` * t and t' = t - spent:

- look once after n_E = ceil(1 / spent) - 1 draws: no exceedance yet -> reject, p = spent;
- otherwise Besag-Clifford at level t' (cap B' = ceil(h / t')), p = min(1, p_BC + spent).

Guarantee: let E be the event "no exceedance in the first n_E draws". Given T, the draws exceed
independently with probability q(T) >= the exact p-value of T, which is super-uniform under H0, so
P(E) = E[(1 - q)^n_E] <= integral of (1 - x)^n_E dx = 1 / (n_E + 1) <= spent. Then for every a,
P(p <= a) <= 1[spent <= a] spent + P(p_BC <= a - spent) <= a: the size stays exact at every Holm
step. Cost: a clearly rejected criterion stops after n_E ~ 2 / t draws instead of 30 / t (15x fewer
at EARLY_SHARE = 1/2); a PASS costs the same ~h (1 + ln(B' / h)) draws; a borderline rejection runs to
B' = 2 B. Power: the rejection event contains {p_BC <= t'}, so MDEs are computed at t' in place of t
(`decision_level`), a few per cent larger than Besag-Clifford's at t.

Ties: T* within a relative `TIE_RTOL` of T counts as an exceedance, so that rounding in the
summation order can only make the p-value larger (conservative), never smaller.

Streams: `criterion_rng` draws from `specval.stats.stream.Stream` (Philox raw words and this
project's transforms: the same draws under every supported numpy and scipy), version 3
(`CURRENT_STREAM`, `philox4x64-10/specval-3`: packed uniform digits for the sequence nulls, and
multinomial and hypergeometric tables in O(cells) by `specval.stats.variates`) for new analyses,
version 2 (`SECOND_STREAM`) or 1 (`FIRST_STREAM`) for bundles that record it. Bundles sealed before the
project's stream existed drew from numpy's PCG64 Generator methods (`LEGACY_STREAM`), whose
algorithms numpy may change between releases; a bundle records its stream in summary.json
(`monte_carlo_stream`; absent: the legacy one) and `specval verify` redraws with that one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable

import numpy as np
from scipy import stats

from specval.stats import checks
from specval.stats.results import StatResult
from specval.stats.stream import STREAM_NAME, STREAM_V1, STREAM_V2, VERSIONS, Stream

EXCEEDANCES = 30  # h: stop at the h-th null statistic >= the observed one
BESAG_CLIFFORD = "besag-clifford"  # the rule of the module docstring alone
EARLY_REJECTION = "besag-clifford+early-rejection-1"  # one early look for rejection, level split
RULES = (BESAG_CLIFFORD, EARLY_REJECTION)
EARLY_SHARE = 0.5  # the share of a criterion's level spent on the early look (module docstring)
DECISION_LEVEL_FACTOR = 0.5  # MDEs are computed at level t * this (see the module docstring)
TIE_RTOL = 1e-9  # float64 sums of <= 1e6 terms differ by far less than 1e-9 relative between orders
FIRST_BATCH = 64  # batch sizes double from here, so the draw count overshoots by < 2x

NullDraws = Callable[[np.random.Generator, int], np.ndarray]  # (rng, b) -> f64[b] null statistics
CURRENT_STREAM = STREAM_NAME  # the stream of every new analysis (version 3)
SECOND_STREAM = STREAM_V2  # version 2: bundles sealed before version 3 existed
FIRST_STREAM = STREAM_V1  # version 1: bundles sealed before version 2 existed
LEGACY_STREAM = "numpy-pcg64"  # bundles sealed before the stream was recorded: numpy's Generator methods
STREAMS = (CURRENT_STREAM, SECOND_STREAM, FIRST_STREAM, LEGACY_STREAM)


@dataclasses.dataclass(frozen=True)
class McPValue(StatResult):
    """A sequential Monte Carlo p-value: `draws` null statistics, `exceedances` of them >= T."""

    p_value: float
    draws: int
    exceedances: int
    max_draws: int
    stopped_early: bool


def num_draws(level: float) -> int:
    """B = ceil(h / t): the draw cap that resolves decisions at level t (module docstring)."""
    level = checks.probability("level", level)
    return int(math.ceil(EXCEEDANCES / level))


def decision_power(level: float) -> float:
    """P(the Monte Carlo test at `level` rejects | exact p-value = level * DECISION_LEVEL_FACTOR)."""
    return float(stats.binom.cdf(EXCEEDANCES - 1, num_draws(level), level * DECISION_LEVEL_FACTOR))


def _check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"unknown Monte Carlo rule {rule!r}; this specval knows {list(RULES)}")
    return rule


def early_look(level: float) -> tuple[float, int]:
    """(spent, n_E) of the early rule at `level`: reject after n_E = ceil(1 / spent) - 1 draws
    without an exceedance, an event of null probability <= 1 / (n_E + 1) <= spent."""
    spent = EARLY_SHARE * checks.probability("level", level)
    return spent, max(1, int(math.ceil(1.0 / spent)) - 1)


def decision_level(level: float, rule: str = BESAG_CLIFFORD) -> float:
    """The level at which the Besag-Clifford part of `rule` decides a criterion tested at `level`:
    `level` itself, or level - spent under the early rule. MDEs are computed at it."""
    level = checks.probability("level", level)
    return level - early_look(level)[0] if _check_rule(rule) == EARLY_REJECTION else level


def max_draws(level: float, rule: str = BESAG_CLIFFORD) -> int:
    """The most null statistics `sequential_pvalue` draws for a criterion tested at `level` under
    `rule`: its cap num_draws(decision_level(level, rule)), drawn by a rejected or borderline
    criterion (the early look comes within it). What a run's Monte Carlo budget counts."""
    return num_draws(decision_level(level, rule))


def rejected_early(result: McPValue) -> bool:
    """Whether `result` is an early rejection of the early rule (stopped with no exceedance)."""
    return result.stopped_early and result.exceedances == 0


def criterion_rng(*keys: str, stream: str = CURRENT_STREAM) -> Stream | np.random.Generator:
    """The null draws of one criterion, keyed by sha256 of the keys (e.g. protocol hash, criterion,
    seed range), so that `specval verify` redraws the same null statistics bit for bit: a `Stream`
    of the stream's version (its 128-bit key: the digest's first 16 bytes, little-endian), or for LEGACY_STREAM a PCG64
    Generator seeded by the same integer (the draws of bundles sealed before streams were recorded).
    Both offer `random`, `integers`, `multinomial` and `multivariate_hypergeometric`."""
    if stream not in STREAMS:
        raise ValueError(f"unknown Monte Carlo stream {stream!r}; this specval draws {list(STREAMS)}")
    digest = hashlib.sha256("\x1f".join(keys).encode()).digest()
    key = int.from_bytes(digest[:16], "little")
    if stream == LEGACY_STREAM:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))
    return Stream(key, version=VERSIONS[stream])


def sequential_pvalue(
    observed: float, draw: NullDraws, level: float, rng: np.random.Generator, rule: str = BESAG_CLIFFORD
) -> McPValue:
    """Sequential Monte Carlo p-value of the statistic `observed` against the null sampler `draw`.

    Assumptions: `draw(rng, b)` returns b i.i.d. draws of the statistic under H0 (the same
    function, array layout and summation order as the one that computed `observed`).
    Guarantee: P(p <= a) <= a under H0 for every a (Besag-Clifford; with `rule` EARLY_REJECTION
    the split of the module docstring); deterministic in `rng`. An early rejection returns
    exceedances = 0 with `stopped_early` set (Besag-Clifford's own stop has exceedances = h).
    Scaling: O(draws * cost of one null statistic); draws <= num_draws(decision_level(level, rule)).
    """
    spent, look = early_look(level) if _check_rule(rule) == EARLY_REJECTION else (0.0, 0)
    cap = num_draws(level - spent)
    threshold = observed - TIE_RTOL * max(abs(observed), 1.0)
    drawn, hits, batch = 0, 0, FIRST_BATCH
    while drawn < cap:
        size = min(batch, cap - drawn, look - drawn if drawn < look else cap)
        exceed = draw(rng, size) >= threshold  # bool[size]
        running = hits + np.cumsum(exceed)
        if running[-1] >= EXCEEDANCES:
            stop = int(np.argmax(running >= EXCEEDANCES)) + 1
            return McPValue(min(1.0, EXCEEDANCES / (drawn + stop) + spent), drawn + stop, EXCEEDANCES, cap, True)
        drawn, hits, batch = drawn + size, int(running[-1]), 2 * batch
        if drawn == look and hits == 0:
            return McPValue(spent, drawn, 0, cap, True)
    return McPValue(min(1.0, (hits + 1) / (cap + 1) + spent), cap, hits, cap, False)
