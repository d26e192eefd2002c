"""Verdict of a sequence protocol: the criteria of every group, Holm within each role, MDEs.

Per group (the tests of the protocol name which groups), from the samples and the reference parts
alone (so `specval verify` recomputes it bit for bit), each criterion as `name` (role): statistic;
what it sees:

- `support.<g>` (control, always): tokens outside the target's support (beyond `support_tolerance`);
  sees any token the target can never emit.
- `pit_pooled.<g>` (pit): uniformity X^2 of all randomized PITs, rank order; sees every token's law,
  pooled.
- `pit_position.<g>` (pit): the same, one bucket per (round position 1..K+1, quarter of the
  sequence), the largest bucket X^2 (criteria version 2); sees one wrong draft position, the bonus,
  later rounds, each at its own bucket's size.
- `pit_path.<g>` (pit): PITs in token-id order, one bucket per (round position, previous round's
  length), max-type; sees reused or overlapping uniforms between rounds.
- `serial.<g>` (serial): binned dependence of U_i and U_{i+l}, l = 1..K+1, id order; sees frozen or
  overlapping RNG offsets.
- `equal_t1_adjacent.<g>`, `equal_t1_cross.<g>` (independence): count of equal first tokens of
  paired requests, exact Poisson-binomial, two-sided; sees streams that make paired first tokens
  agree more often (shared, overlapping) or less often than sum p^2 (an antithetic stream does
  either, or neither, as the law's id order decides: the association criteria see it regardless).
- `association_adjacent.<g>`, `association_cross.<g>` (independence): rank correlation and binned
  X^2 of paired PITs, every token; sees correlated streams at any position.
- `identical.<g>` (independence): adjacent pairs with identical whole sequences; sees a stream
  shared outright.
- `reproducible.<g>` (reproducibility, deterministic): re-run seeds whose tokens changed with their
  slot and batch; sees batch-dependent sampling.
- `companions.<g>` (control, groups with companions): companion tokens outside their own law's
  support (greedy: not the argmax); sees neighbours served with the tested rows' parameters.
- `pit_source.<g>` (source, speculative groups): each token's PIT under its source's law (accepted
  ~ min(p, q) / beta, correction ~ (p - q)+ / (1 - beta), bonus ~ p), max-type over (source,
  position); sees a bug in one source at one position, undiluted by the other sources.
- `accepts.<g>` (source): accepted drafts per draft position against Poisson-binomial(beta), beta
  = sum min(p, q); sees an accept rule that accepts too often or too seldom.
- `pit_draft.<g>` (drafts, speculative groups whose adapter reports its drafts): the drafted token
  at every accepted or correction token, rejected drafts included, its randomized PIT under q,
  max-type over draft positions 1..K; sees drafts sampled from another q than the one the accept
  and the residual use (raw vs processed logits, another precision), at the drafts themselves.

A group with companions shares every batch with requests of other sampling parameters (greedy among
them); its tested requests go through every criterion above, so a law that changes with the
neighbours FAILs them, and its re-run (a batch without companions) must reproduce them bit for bit.

Pairs: "adjacent" = slots 2i and 2i + 1 of one batch; "cross" = slot s of batches b and b + P (P
prompts; b in the first P batches of each block of 2P, so pairs are disjoint). Each p-valued
criterion is an exact discrete law or a sequential Monte Carlo null; pit_pooled, serial and the
independence criteria are exact-size, while pit_position, pit_path, pit_source and accepts condition
on bucket sizes (tested drafts) that depend on earlier tokens, so their size is measured, not proved
(docs/harness.md section 9, "Exactness, stated"; `benchmarks/sequence_calibration.py` calibrates the
whole family). Holm within each role keeps the family-wise false-fail rate <= alpha given valid
p-values, under any dependence between them; the run verdict is the distribution kind's
(`specval.distribution.decision.run_verdict`): PASS iff every control and primary criterion passes.
The randomized PITs' uniforms V and the Monte Carlo nulls come from `criterion_rng` streams keyed
by the protocol hash, the group, the criterion and the group's first seed; every Monte Carlo
p-value of version 2 uses the early-rejection rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from specval.distribution.decision import FAIL, INCONCLUSIVE, PASS, decide
from specval.sequence import reference, workers
from specval.sequence.protocol import SequenceProtocol
from specval.stats import independence, sequence, sequence_power
from specval.stats.montecarlo import BESAG_CLIFFORD, CURRENT_STREAM, EARLY_REJECTION, criterion_rng, decision_level
from specval.stats.power import NOTHING_DETECTABLE

QUARTERS = 4  # sequence-index buckets of pit_position: early to late tokens
# The criteria's rules, recorded in summary.json (`criteria_version`) so that `specval verify`
# recomputes a bundle by the rules it was sealed with. 1: pit_position / pit_path sum their buckets'
# X^2, Monte Carlo p-values by Besag-Clifford, streams keyed by the group's first seed. 2: they take
# the largest bucket X^2 (a bug in one bucket is judged at that bucket's size), every Monte Carlo
# p-value by the early-rejection rule (a clear FAIL stops after ~2 / level draws); streams keyed as
# in version 1. 3: the equal-first-token criteria print their MDE of either sign (an increase and a
# decrease of P(t1 equal), signed) and the observed signed change; every p-value and verdict as in 2.
FIRST_RULES = 1
MAX_TYPE_RULES = 2
SIGNED_EFFECT_RULES = 3
CURRENT_RULES = SIGNED_EFFECT_RULES
RULES = (FIRST_RULES, MAX_TYPE_RULES, SIGNED_EFFECT_RULES)
ENDS_ROUND = ("correction", "bonus", "plain")  # sources that close a round ("accepted" continues it)
P_VALUED = {
    "pit": ("pit_pooled", "pit_position", "pit_path"),
    "serial": ("serial",),
    "independence": ("equal_t1_adjacent", "equal_t1_cross", "association_adjacent", "association_cross", "identical"),
    "source": ("pit_source", "accepts"),
    "drafts": ("pit_draft",),
}
SOURCE_CODES = {"accepted": 0, "correction": 1, "bonus": 2, "plain": 3}  # pit_source's bucket: source x position
DETERMINISTIC = {"reproducibility": ("reproducible",)}
CRITERIA = P_VALUED | DETERMINISTIC
__all__ = ["CRITERIA", "FAIL", "INCONCLUSIVE", "PASS", "GroupSequences", "evaluate", "family_sizes", "round_positions"]


@dataclass(frozen=True)
class GroupSequences:
    """One group's tokens and reference parts as [N, L] arrays in (batch, slot) row order."""

    tokens: np.ndarray
    sources: np.ndarray
    batch: np.ndarray  # int64[N]
    slot: np.ndarray  # int64[N]
    parts: dict[str, np.ndarray]  # reference.PART_COLUMNS -> [N, L]
    rerun_tokens: np.ndarray  # [R, L] re-run tokens, rows in seed order
    rerun_expected: np.ndarray  # [R, L] the first run's tokens of the same seeds
    companion_status: np.ndarray | None = None  # [C, L] reference status of companion tokens; None: no companions


def group_sequences(
    samples: pd.DataFrame, rerun: pd.DataFrame, parts: pd.DataFrame, length: int, companions: pd.DataFrame | None = None
) -> GroupSequences:
    """Reshape one group's long tables (sorted by batch, slot, index) into [N, L] arrays;
    `companions`: the companion status table of a group with companions."""
    shape = (-1, length)
    seeds = samples["seed"].to_numpy()[::length]
    rerun_seeds = rerun["seed"].to_numpy()[::length]
    rerun_order = np.argsort(rerun_seeds)
    first = np.searchsorted(seeds, rerun_seeds[rerun_order]) if np.all(np.diff(seeds) > 0) else None
    tokens = samples["token"].to_numpy().reshape(shape)
    return GroupSequences(
        tokens=tokens,
        sources=samples["source"].to_numpy().reshape(shape),
        batch=samples["batch"].to_numpy()[::length],
        slot=samples["slot"].to_numpy()[::length],
        parts={
            name: parts[name].to_numpy().reshape(shape)
            for name in reference.PART_COLUMNS + reference.SOURCE_COLUMNS + reference.DRAFT_COLUMNS
            if name in parts.columns
        },
        rerun_tokens=rerun["token"].to_numpy().reshape(shape)[rerun_order],
        rerun_expected=tokens[first] if first is not None else np.full((len(rerun_order), length), -1),
        companion_status=None if companions is None else companions["status"].to_numpy().reshape(shape),
    )


# ---------------------------------------------------------------- round structure


def round_positions(sources: np.ndarray, num_speculative_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(position, previous) int64[N, L]: each token's position 1..K+1 in its round and the length of
    the round before it (0 in the first round). A round is a run of "accepted" tokens closed by a
    correction, a bonus or a plain token; positions past K + 1 (a SUT reporting more than K accepted
    drafts in a row) are clipped to K + 1. Both depend on the past only (predictable buckets)."""
    top = num_speculative_tokens + 1
    ends = np.isin(sources, ENDS_ROUND)
    position = np.empty(sources.shape, dtype=np.int64)
    previous = np.empty(sources.shape, dtype=np.int64)
    counter = np.ones(sources.shape[0], dtype=np.int64)
    last = np.zeros(sources.shape[0], dtype=np.int64)
    for i in range(sources.shape[1]):
        position[:, i], previous[:, i] = np.minimum(counter, top), np.minimum(last, top)
        last = np.where(ends[:, i], counter, last)
        counter = np.where(ends[:, i], 1, counter + 1)
    return position, previous


def pits(data: GroupSequences, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(rank-order U, id-order U) [N, L]: one uniform V per token, shared by both orders."""
    v = rng.random(data.tokens.size).reshape(data.tokens.shape)
    mass = data.parts["mass"]
    clip = sequence.TOP_OF_UNIT
    return (
        np.minimum(data.parts["lower_rank"] + v * mass, clip),
        np.minimum(data.parts["lower_index"] + v * mass, clip),
    )


# ---------------------------------------------------------------- pairs


def adjacent_pairs(data: GroupSequences) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (a, b): slots 2i and 2i + 1 of one batch."""
    even = np.flatnonzero(data.slot % 2 == 0)
    partner = {(int(b), int(s)): r for r, (b, s) in enumerate(zip(data.batch, data.slot))}
    b_rows = np.array([partner[(int(data.batch[r]), int(data.slot[r]) + 1)] for r in even], dtype=np.int64)
    return even, b_rows


def cross_pairs(data: GroupSequences, num_prompts: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (a, b): slot s of batch b and of batch b + P, for b with (b // P) even and b + P
    present (disjoint pairs of batches of the same prompt)."""
    partner = {(int(b), int(s)): r for r, (b, s) in enumerate(zip(data.batch, data.slot))}
    a_rows = [
        r
        for r, b in enumerate(data.batch)
        if (b // num_prompts) % 2 == 0 and (int(b) + num_prompts, int(data.slot[r])) in partner
    ]
    b_rows = [partner[(int(data.batch[r]) + num_prompts, int(data.slot[r]))] for r in a_rows]
    return np.asarray(a_rows, dtype=np.int64), np.asarray(b_rows, dtype=np.int64)


# ---------------------------------------------------------------- criteria


def _row(
    kind: str,
    role: str,
    group: str,
    statistic: float,
    p_value: float | None,
    n: int,
    mde: float | None,
    label: str,
    details: dict | None = None,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "role": role,
        "group": group,
        "statistic": float(statistic),
        "p_value": p_value,
        "p_adjusted": None,
        "alpha": None,
        "mde_tv": None if mde is None or mde == NOTHING_DETECTABLE else mde,
        "mde_label": label,
        "effective_n": int(n),
        "verdict": None,
        "reason": "",
        **(details or {}),
    }


def _deterministic(kind: str, group: str, failures: int, what: str, n: int, details: dict | None = None) -> dict:
    row = _row(kind, "control", group, failures, None, n, None, "", details)
    row["verdict"], row["reason"] = (FAIL if failures else PASS), f"{failures} {what}"
    return row


def support_criterion(group: str, data: GroupSequences) -> dict:
    status = data.parts["status"]
    out = int((status == reference.OUT_OF_SUPPORT).sum())
    boundary = int((status == reference.BOUNDARY).sum())
    return _deterministic(
        "support",
        group,
        out,
        f"token(s) outside the target's support ({boundary} within the support tolerance, not counted)",
        status.size,
        {"boundary_tokens": boundary},
    )


def companions_criterion(group: str, data: GroupSequences) -> dict:
    status = data.companion_status
    out = int((status == reference.OUT_OF_SUPPORT).sum())
    boundary = int((status == reference.BOUNDARY).sum())
    return _deterministic(
        "companions",
        group,
        out,
        f"companion token(s) outside their own law's support ({boundary} within the support tolerance, not counted)",
        status.size,
        {"boundary_tokens": boundary},
    )


def reproducible_criterion(group: str, data: GroupSequences) -> dict:
    changed = int((data.rerun_tokens != data.rerun_expected).any(axis=1).sum())
    return _deterministic(
        "reproducible",
        group,
        changed,
        f"of {len(data.rerun_tokens)} re-run seed(s) changed tokens in another slot and batch",
        len(data.rerun_tokens),
    )


@dataclass(frozen=True)
class Context:
    """What every p-valued criterion of one group reads."""

    protocol: SequenceProtocol
    group: str
    data: GroupSequences
    u_rank: np.ndarray
    u_index: np.ndarray
    position: np.ndarray
    previous: np.ndarray
    level: float  # Holm's first step of the criterion's role: alpha / m
    rng: Callable[[str], np.random.Generator]
    rules: int = CURRENT_RULES  # `RULES`

    @property
    def rule(self) -> str:
        """The Monte Carlo rule of every p-value of this context (`montecarlo.RULES`)."""
        return EARLY_REJECTION if self.rules >= MAX_TYPE_RULES else BESAG_CLIFFORD

    @property
    def mde_level(self) -> float:
        """The level the MDEs are computed at: the Besag-Clifford part's (`montecarlo.decision_level`)."""
        return decision_level(self.level, self.rule)


POOLED_LABEL = "mean binned PIT TV over buckets"
BUCKET_LABEL = "binned PIT TV in one bucket of mean size (every bucket's: bucket_mde)"


def _draws(ctx: Context, *results: Any) -> dict[str, int]:
    """{"mc_draws": the null statistics drawn for the criterion's p-value(s)} from the second rules
    on (a clear FAIL shows its early stop there); nothing for bundles of the first."""
    if ctx.rules < MAX_TYPE_RULES:
        return {}
    return {"mc_draws": sum(mc.draws for mc in results if mc is not None)}


def _pit(ctx: Context, name: str, u: np.ndarray, buckets: np.ndarray | None) -> tuple:
    combine = "max" if buckets is not None and ctx.rules >= MAX_TYPE_RULES else "sum"
    result = sequence.pit_uniformity(
        u.reshape(-1),
        None if buckets is None else buckets.reshape(-1),
        level=ctx.level,
        rng=ctx.rng(name),
        combine=combine,
        rule=ctx.rule,
    )
    details = {"bucket_keys": result.bucket_keys, "bucket_sizes": result.bucket_sizes} | _draws(ctx, result.mc)
    if combine == "sum" or result.is_degenerate:
        mde = sequence_power.pit_uniformity_mde(
            result.n, [ctx.mde_level], num_buckets=max(len(result.bucket_keys), 1), power=ctx.protocol.power
        )
        return result.statistic, result.p_value, result.n, mde, POOLED_LABEL, details
    num_buckets = len(result.bucket_keys)

    def one_bucket(n: int) -> float:
        return sequence_power.bucket_mde(n, [ctx.mde_level], num_buckets=num_buckets, power=ctx.protocol.power)

    worst = int(np.argmax(result.bucket_statistics))
    details |= {
        "bucket_mde": [None if (m := one_bucket(n)) == NOTHING_DETECTABLE else m for n in result.bucket_sizes],
        "bucket_statistics": result.bucket_statistics,
        "worst_bucket": result.bucket_keys[worst],
    }
    return result.statistic, result.p_value, result.n, one_bucket(result.n // num_buckets), BUCKET_LABEL, details


def pit_pooled(ctx: Context) -> tuple:
    return _pit(ctx, "pit_pooled", ctx.u_rank, None)


def pit_position(ctx: Context) -> tuple:
    length = ctx.u_rank.shape[1]
    quarter = (np.arange(length) * QUARTERS // length)[None, :]
    return _pit(ctx, "pit_position", ctx.u_rank, ctx.position * QUARTERS + quarter)


def pit_path(ctx: Context) -> tuple:
    return _pit(ctx, "pit_path", ctx.u_index, ctx.position * (ctx.protocol.num_speculative_tokens + 2) + ctx.previous)


def serial(ctx: Context) -> tuple:
    max_lag = ctx.protocol.num_speculative_tokens + 1
    result = sequence.serial_dependence(
        list(ctx.u_index), max_lag, level=ctx.level, rng=ctx.rng("serial"), rule=ctx.rule
    )
    pairs = result.lag_pairs[0] if result.lag_pairs else 0
    mde = sequence_power.serial_dependence_mde(pairs, [ctx.mde_level], max_lag=max_lag, power=ctx.protocol.power)
    return (
        result.statistic,
        result.p_value,
        result.n,
        mde,
        "TV of one lag's pair-bin law from independence",
        {"lag_statistics": result.lag_statistics} | _draws(ctx, result.mc),
    )


EQUAL_T1_LABEL = "relative change of P(t1 equal)"


def _equal_t1(ctx: Context, rows: tuple[np.ndarray, np.ndarray]) -> tuple:
    """The count of equal first tokens of paired requests against Poisson-binomial(sum p^2), a
    two-sided exact p-value: more equal pairs (shared or overlapping streams) and fewer (streams
    that push paired draws apart) are both rejected. The MDE is the larger of the relative increase
    and decrease detected with the protocol's power (each side at level / 2); from criteria version 3
    the row prints both, signed (`mde_increase` > 0, `mde_decrease` < 0), and the observed signed
    change count / expected - 1."""
    a, b = rows
    pi = ctx.data.parts["self_match"][a, 0]  # same prompt, empty prefix: one law p, P(equal) = sum p^2
    count = int((ctx.data.tokens[a, 0] == ctx.data.tokens[b, 0]).sum())
    p_value = independence.discrete_pvalue(independence.poisson_binomial_pmf(pi), count, "two-sided")
    increase, decrease = (
        sequence_power.equal_rate_mde(pi, [ctx.level / 2], alternative=alt, power=ctx.protocol.power)
        for alt in ("greater", "less")
    )
    expected = float(pi.sum())
    ratio = count / expected if expected > 0 else None
    details: dict[str, Any] = {"expected": expected, "ratio": ratio}
    if ctx.rules < SIGNED_EFFECT_RULES:
        return count, p_value, len(a), max(increase, decrease), EQUAL_T1_LABEL, details
    up, down = (None if m == NOTHING_DETECTABLE else m for m in (increase, decrease))
    label = f"{EQUAL_T1_LABEL}, either sign ({_signed(up, '+')} or {_signed(down, '-')} alone)"
    details |= {
        "alternative": "two-sided",
        "change": None if ratio is None else ratio - 1.0,
        "mde_increase": up,
        "mde_decrease": None if down is None else -down,
    }
    return count, p_value, len(a), max(increase, decrease), label, details


def _signed(mde: float | None, sign: str) -> str:
    return "nothing detectable" if mde is None else f"{sign}{mde:.3g}"


def equal_t1_adjacent(ctx: Context) -> tuple:
    return _equal_t1(ctx, adjacent_pairs(ctx.data))


def equal_t1_cross(ctx: Context) -> tuple:
    return _equal_t1(ctx, cross_pairs(ctx.data, len(ctx.protocol.prompts)))


def _association(ctx: Context, name: str, rows: tuple[np.ndarray, np.ndarray]) -> tuple:
    a, b = rows
    result = independence.pit_association(
        ctx.u_index[a].reshape(-1), ctx.u_index[b].reshape(-1), level=ctx.level, rng=ctx.rng(name), rule=ctx.rule
    )
    mde = sequence_power.association_rho_mde(result.n, [ctx.mde_level], power=ctx.protocol.power)
    return (
        abs(result.rho),
        result.p_value,
        result.n,
        mde,
        "|Spearman rho| of paired PITs",
        {"rho": result.rho, "chi2": result.chi2} | _draws(ctx, result.mc_rho, result.mc_chi2),
    )


def association_adjacent(ctx: Context) -> tuple:
    return _association(ctx, "association_adjacent", adjacent_pairs(ctx.data))


def association_cross(ctx: Context) -> tuple:
    return _association(ctx, "association_cross", cross_pairs(ctx.data, len(ctx.protocol.prompts)))


def identical(ctx: Context) -> tuple:
    a, b = adjacent_pairs(ctx.data)
    match = np.array([independence.sequence_match_probability(m) for m in ctx.data.parts["mass"][a]])
    result = independence.identical_sequences(list(ctx.data.tokens[a]), list(ctx.data.tokens[b]), match)
    mde = sequence_power.identical_pairs_mde(match, [ctx.level], power=ctx.protocol.power)
    return (
        result.count,
        result.p_value,
        result.n_pairs,
        mde,
        "fraction of pairs sharing a stream",
        {"expected": result.expected, "identical_pairs": result.identical_pairs[:10]},
    )


def pit_source(ctx: Context) -> tuple:
    """Every token's randomized PIT under the law of its source (accepted ~ min(p, q) / beta,
    correction ~ (p - q)+ / (1 - beta), bonus and plain ~ p), max-type over (source, round position)
    buckets. Given the past and its source label a token follows that law exactly, so each U is
    U(0, 1) given everything before it; a bug in ONE source at ONE position is judged at that
    bucket's size, not diluted by the mixture of sources the label-free PITs see."""
    parts = ctx.data.parts
    v = ctx.rng("source-uniforms").random(ctx.data.tokens.size).reshape(ctx.data.tokens.shape)
    u = np.minimum(parts["source_lower"] + v * parts["source_mass"], sequence.TOP_OF_UNIT)
    codes = np.vectorize(SOURCE_CODES.get, otypes=[np.int64])(ctx.data.sources)
    result = _pit(ctx, "pit_source", u, codes * (ctx.protocol.num_speculative_tokens + 2) + ctx.position)
    impossible = int((parts["source_mass"] <= 0).sum())
    return result[:5] + (result[5] | {"impossible_tokens": impossible},)


DRAFTED = ("accepted", "correction")  # the sources that stand at a draft (the bonus and plain do not)


def pit_draft(ctx: Context) -> tuple:
    """The drafted token x_j at every token that stands at one (accepted: the token itself;
    correction: the rejected draft), its randomized PIT under q_j (`draft_lower`, `draft_mass`),
    max-type over draft positions j = 1..K. Position j of a round is reached, and its draft drawn,
    before anything depends on x_j, so x_j ~ q_j given everything before it and each U is U(0, 1)
    given the past, whether the draft was then accepted or not; which tokens stand at a draft is
    predictable (the round position), so the selected U are i.i.d. U(0, 1) in sequence order. The
    number of drafts in each bucket depends on earlier acceptances, which depend on earlier drafts,
    as pit_source's bucket sizes do, so the size is measured, not proved (docs/harness.md section
    9, "Exactness, stated"). A draft q cannot emit has its PIT at the top of the unit and is counted
    (`impossible_drafts`)."""
    parts, drafted = ctx.data.parts, np.isin(ctx.data.sources, DRAFTED)
    v = ctx.rng("draft-uniforms").random(ctx.data.tokens.size).reshape(ctx.data.tokens.shape)
    u = np.minimum(parts["draft_lower"] + v * parts["draft_mass"], sequence.TOP_OF_UNIT)
    result = _pit(ctx, "pit_draft", u[drafted], ctx.position[drafted])
    impossible = int((parts["draft_mass"][drafted] <= 0).sum())
    return result[:5] + (result[5] | {"impossible_drafts": impossible},)


@dataclass(frozen=True)
class DraftPosition:
    """The accepts test at one draft position: `accepted` drafts of those tested there, `expected`
    = sum beta, the exact two-sided Poisson-binomial `p_value`, and `mde`: the relative drop r of
    every beta there (beta -> (1 - r) beta) detected with the protocol's power by the one-sided
    region at half the position's Bonferroni level (`sequence_power.equal_rate_mde`)."""

    accepted: int
    expected: float
    p_value: float
    mde: float


def accepts_by_position(ctx: Context) -> dict[int, DraftPosition]:
    """Every draft position j = 1..K that holds a tested draft (accepted or corrected), with its
    test at level ctx.level / (positions held) (Bonferroni)."""
    tested = np.isin(ctx.data.sources, ("accepted", "correction"))
    accepted = ctx.data.sources == "accepted"
    beta = np.clip(ctx.data.parts["beta"], 0.0, 1.0)
    positions = [j for j in range(1, ctx.protocol.num_speculative_tokens + 1) if (tested & (ctx.position == j)).any()]
    level = ctx.level / max(len(positions), 1) / 2
    out = {}
    for j in positions:
        here = tested & (ctx.position == j)
        out[j] = DraftPosition(
            accepted=int(accepted[here].sum()),
            expected=float(beta[here].sum()),
            p_value=independence.discrete_pvalue(
                independence.poisson_binomial_pmf(beta[here]), int(accepted[here].sum()), "two-sided"
            ),
            mde=sequence_power.equal_rate_mde(beta[here], [level], alternative="less", power=ctx.protocol.power),
        )
    return out


def accepts(ctx: Context) -> tuple:
    """The number of accepted drafts at each draft position j = 1..K against Poisson-binomial(beta)
    of the tokens tested there (accepted or corrected drafts): given its prefix, a draft is accepted
    with probability beta = sum min(p, q) exactly. Two-sided exact p-value per position, Bonferroni
    over the positions that hold a draft (min(1, J min p_j)); the MDE printed is the largest of the
    positions' (`accepts_by_position`)."""
    by_position = accepts_by_position(ctx)
    tested = np.isin(ctx.data.sources, ("accepted", "correction"))
    p_value = min(1.0, len(by_position) * min(d.p_value for d in by_position.values())) if by_position else 1.0
    return (
        max((abs(d.accepted - d.expected) for d in by_position.values()), default=0.0),
        p_value,
        int(tested.sum()),
        max((d.mde for d in by_position.values()), default=None),
        "relative drop of the acceptance rate at one draft position",
        {
            "accepted": {str(j): d.accepted for j, d in by_position.items()},
            "expected": {str(j): d.expected for j, d in by_position.items()},
            "position_p_values": {str(j): d.p_value for j, d in by_position.items()},
        },
    )


P_VALUED_FUNCTIONS = {
    "pit_pooled": pit_pooled,
    "pit_position": pit_position,
    "pit_path": pit_path,
    "serial": serial,
    "equal_t1_adjacent": equal_t1_adjacent,
    "equal_t1_cross": equal_t1_cross,
    "association_adjacent": association_adjacent,
    "association_cross": association_cross,
    "identical": identical,
    "pit_source": pit_source,
    "accepts": accepts,
    "pit_draft": pit_draft,
}


# ---------------------------------------------------------------- the family


def planned_criteria(protocol: SequenceProtocol) -> list[tuple[str, str, str]]:
    """(criterion name, role, group) of every criterion the tests ask for, support checks first."""
    out = [(f"support.{g.name}", "control", g.name) for g in protocol.groups]
    out += [(f"companions.{g.name}", "control", g.name) for g in protocol.groups if g.companions]
    for test in protocol.tests:
        for group in protocol.groups_of(test):
            out += [(f"{name}.{group}", test.role, group) for name in CRITERIA[test.kind]]
    return out


def family_sizes(protocol: SequenceProtocol) -> dict[str, int]:
    """Holm's m per role: the p-valued criteria, fixed by the protocol before any data."""
    sizes: dict[str, int] = {}
    for name, role, _ in planned_criteria(protocol):
        if name.split(".")[0] in P_VALUED_FUNCTIONS:
            sizes[role] = sizes.get(role, 0) + 1
    return sizes


def evaluate(
    protocol: SequenceProtocol,
    data: dict[str, GroupSequences],
    seed_ranges: dict[str, tuple[int, int]],
    stream: str = CURRENT_STREAM,
    rules: int = CURRENT_RULES,
) -> dict:
    """Every criterion, Holm per role and the run verdict: {"tests", "families", "verdict", "reason"};
    the PIT uniforms and Monte Carlo nulls are drawn from `stream` (`montecarlo.STREAMS`), keyed by
    each group's first seed (`seed_ranges`: group -> (start, stop)), by the criteria's `rules` (`RULES`)."""
    if rules not in RULES:
        raise ValueError(f"unknown sequence criteria version {rules!r}; this specval knows {list(RULES)}")
    sizes, tests = family_sizes(protocol), {}
    contexts: dict[str, Context] = {}
    p_valued: dict[str, tuple[str, str, str, Context]] = {}
    for name, role, group in planned_criteria(protocol):
        kind = name.split(".")[0]
        if kind == "support":
            tests[name] = support_criterion(group, data[group])
        elif kind == "companions":
            tests[name] = companions_criterion(group, data[group])
        elif kind == "reproducible":
            tests[name] = reproducible_criterion(group, data[group]) | {"role": role}
        else:
            ctx = contexts.get(f"{group}/{role}") or _context(
                protocol, group, data[group], role, sizes, seed_ranges[group], stream, rules
            )
            contexts[f"{group}/{role}"] = ctx
            tests[name], p_valued[name] = {}, (kind, role, group, ctx)  # filled below, in this order
    tests.update(_p_valued_rows(p_valued))
    families, verdict, reason = decide(tests, protocol)
    return {"tests": tests, "families": families, "verdict": verdict, "reason": reason}


def _p_valued_rows(planned: dict[str, tuple[str, str, str, Context]]) -> dict[str, dict]:
    """The row of every p-valued criterion (name -> (kind, role, group, context)), computed on
    `workers.count()` threads: each criterion draws from its own streams (`Context.rng`) and reads
    its context only, so the rows are those of one thread."""
    names = list(planned)

    def job(name: str) -> Callable[[], dict]:
        kind, role, group, ctx = planned[name]
        return lambda: _row(kind, role, group, *P_VALUED_FUNCTIONS[kind](ctx))

    return dict(zip(names, workers.pipelined((job(name) for name in names), workers.count())))


def _context(
    protocol: SequenceProtocol,
    group: str,
    data: GroupSequences,
    role: str,
    sizes: dict[str, int],
    seed_range: tuple[int, int],
    stream: str,
    rules: int,
) -> Context:
    range_key = str(seed_range[0])  # the group's first seed (a range's start is unique in its ledger)

    def rng(name: str) -> np.random.Generator:
        return criterion_rng(protocol.hash, group, name, range_key, stream=stream)

    u_rank, u_index = pits(data, rng("pit-uniforms"))
    position, previous = round_positions(data.sources, protocol.num_speculative_tokens)
    level = protocol.alpha / max(sizes.get(role, 1), 1)
    return Context(protocol, group, data, u_rank, u_index, position, previous, level, rng, rules)
