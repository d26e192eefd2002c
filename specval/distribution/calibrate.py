"""Calibrate: the observed false-fail rate of a protocol on the correct SUT (A/A replicates).

One collection claims `replicates * samples` fresh seeds per group from the ledger (disjoint from
every earlier run of the protocol), then the protocol's criteria are evaluated on each of the
`replicates` consecutive, disjoint seed slices of `samples` per group: replicate i of group g uses
seeds [start_g + i * samples, start_g + (i + 1) * samples). Slices share no seed, so the
replicates are independent draws of the whole run at `samples` per group. The reference and the
quadrature laws are computed once (they do not depend on the samples).

Reported per p-valued criterion: FAIL count and rate with a Clopper-Pearson 95% interval, next to
alpha (the Holm family bound), and a KS test of the uniformity of its raw p-values; and the same
rate for the run verdict, next to alpha times the number of gating families. Guarantee: for a
correct SUT each criterion's FAIL rate is <= alpha (Holm), so an interval lying above alpha is
evidence of a miscalibrated test (or a biased SUT).

Exact-sampler mode (`calibrate_exact`, `specval calibrate --exact`): no SUT sampling; every group is
drawn straight from the float64 reference of the whole support tree, as count trees, so the
statistics alone are calibrated, in seconds per hundred replicates and in parallel processes.
Reported per criterion, per family (the unit Holm controls at alpha) and per run.

A protocol with sequential looks (`sequential`) has each replicate decided as a run decides its
first stage (`looks.walk`): look k evaluates the replicate's first n_k samples per group at the
look's level (Holm within each family), and the replicate stops at the first look that FAILs. A
criterion (family, run) FAILs a replicate if it FAILs at any look taken, so the rates are the
family-wise rates over looks that `specval.stats.sequential` bounds by alpha; the result adds, per
look, how many replicates stopped there (`sequential.looks`). KS screens use the p-values of the
first look (every replicate takes it). Protocols without looks are decided as before. Two-stage
protocols are calibrated on their first stage alone, with or without looks.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from specval import bundle as bundles
from specval.distribution import collect, looks, runner
from specval.distribution.criteria import statistical_tests
from specval.distribution.decision import FAIL, decide, gating_failures
from specval.distribution.laws import quadrature_laws, reference_for, token_matrix
from specval.distribution.reference import Reference, build_reference
from specval.distribution.strata import supports_of
from specval.distribution.verdict import evaluate
from specval.protocol import FROZEN, GATING_ROLES, ROLES, Protocol
from specval.stats.montecarlo import criterion_rng
from specval.stats.rates import pvalue_uniformity, rate_ci
from specval.sut import SOURCES, capabilities_of, open_sut

CALIBRATION_FILE = "calibration.json"
RATE_CI_ALPHA = 0.05  # the rate intervals are 95%
EXACT_STREAM = "exact-sampler"  # seeds the exact sampler's data and Monte Carlo streams
BATCHES_PER_WORKER = 4  # replicates are shared out in this many batches per worker process
CHECKPOINT_EVERY = 50  # at most this many replicates per batch, so partial results are written often


def _replicates(samples, ranges, replicates: int, size: int) -> list[tuple]:
    """(rows, spans) of every replicate: replicate i of group g holds the seeds
    [start_g + i * size, start_g + (i + 1) * size). One pass over the rows (a group-by on the
    replicate index), so slicing costs O(rows), not O(replicates * rows)."""
    starts = {r.group: r.start for r in ranges}
    index = (samples["seed"] - samples["group"].map(starts)) // size
    parts = dict(tuple(samples.groupby(index.to_numpy(), sort=True)))
    empty = samples.iloc[:0]
    return [
        (
            parts.get(i, empty).reset_index(drop=True),
            {g: (start + i * size, start + (i + 1) * size) for g, start in starts.items()},
        )
        for i in range(replicates)
    ]


def check_looks(protocol: Protocol, samples: int, protocol_file: Path | str) -> None:
    """ValueError naming `--samples`, its value and the file when the protocol's looks would repeat a
    size at `samples` per replicate (each look needs samples of its own)."""
    if protocol.sequential is not None:
        try:
            looks.schedule(dataclasses.replace(protocol, samples_per_group=samples), protocol.alpha)
        except ValueError as err:
            raise ValueError(
                f"{protocol_file}: --samples {samples} is too small for sequential.looks "
                f"{list(protocol.sequential.looks)} ({err})"
            ) from None


def decide_by_looks(
    protocol: Protocol,
    evaluate_look: Callable[[looks.Look], dict],
    advance: Callable[[looks.Look], None] = lambda look: None,
) -> dict:
    """One replicate of a protocol with looks, decided as a run decides a stage (`looks.walk`):
    `evaluate_look(look)` gives the look's summary (verdicts and p-values at the look's level). The
    result has a summary's `verdict` and `tests` (a criterion FAILs if it FAILs at any look taken;
    its p-value is the first look's) and `stopped_at_look` (1-based)."""
    taken: list[dict] = []

    def evaluate_(look: looks.Look) -> dict:
        taken.append(evaluate_look(look))
        return taken[-1]

    schedule = looks.schedule(protocol, protocol.alpha)
    walked = looks.walk(schedule, advance, evaluate_, lambda s: s["verdict"] == FAIL, gating_failures)
    tests = {
        name: {
            "role": test["role"],
            "p_value": test["p_value"],
            "verdict": FAIL
            if any(s["tests"][name]["verdict"] == FAIL for s in taken)
            else walked.summary["tests"][name]["verdict"],
        }
        for name, test in taken[0]["tests"].items()
    }
    return {"verdict": walked.summary["verdict"], "tests": tests, "stopped_at_look": walked.look.index + 1}


def look_counts(summaries: list[dict], protocol: Protocol) -> dict[str, Any]:
    """The result's `sequential` entry: the rule, the look whose p-values the KS screens use, and per
    look its size, level, how many replicates stopped there and how many of those FAILed (early
    stops all FAIL; the last look takes the rest)."""
    rows = []
    for look in looks.schedule(protocol, protocol.alpha):
        stopped = [s for s in summaries if s["stopped_at_look"] == look.index + 1]
        rows.append(
            {
                "look": look.index + 1,
                "fraction": look.fraction,
                "samples_per_group": look.samples_per_group,
                "level": look.level,
                "stopped": len(stopped),
                "failures": sum(s["verdict"] == FAIL for s in stopped),
            }
        )
    return {"rule": looks.RULE, "spending": protocol.sequential.spending, "ks_p_values_of_look": 1, "looks": rows}


def _summarise_run(summaries: list[dict], protocol: Protocol) -> dict[str, Any]:
    """`summarise`, and the stops per look of a protocol with looks (`protocol`: sized per replicate)."""
    result = summarise(summaries, protocol.alpha)
    if protocol.sequential is not None:
        result["sequential"] = look_counts(summaries, protocol)
    return result


def summarise(summaries: list[dict], alpha: float) -> dict[str, Any]:
    """Per-criterion FAIL rates (with CI) and p-value uniformity, per family (any criterion of the
    role FAILs: the unit Holm controls at alpha) and the run-level FAIL rate."""
    n = len(summaries)
    criteria = {}
    for name in sorted(summaries[0]["tests"]):
        tests = [s["tests"][name] for s in summaries]
        failures = sum(t["verdict"] == FAIL for t in tests)
        p_values = [t["p_value"] for t in tests if t.get("p_value") is not None]
        row = {
            "role": tests[0]["role"],
            "failures": failures,
            "replicates": n,
            "rate": failures / n,
            "rate_ci95": list(rate_ci(failures, n, RATE_CI_ALPHA)),
            "alpha": alpha,
        }
        if p_values:
            row["ks_uniformity"] = pvalue_uniformity(p_values).to_dict()
        criteria[name] = row
    families = {}
    for role in ROLES:
        names = [k for k, t in summaries[0]["tests"].items() if t["role"] == role and t.get("p_value") is not None]
        if names:
            failed = sum(any(s["tests"][k]["verdict"] == FAIL for k in names) for s in summaries)
            families[role] = {
                "criteria": len(names),
                "failures": failed,
                "rate": failed / n,
                "rate_ci95": list(rate_ci(failed, n, RATE_CI_ALPHA)),
                "nominal": alpha,
                "gating": role in GATING_ROLES,
            }
    run_failures = sum(s["verdict"] == FAIL for s in summaries)
    gating = [r for r, f in families.items() if f["gating"]]
    return {
        "replicates": n,
        "criteria": criteria,
        "families": families,
        "run": {
            "failures": run_failures,
            "rate": run_failures / n,
            "rate_ci95": list(rate_ci(run_failures, n)),
            "bound": alpha * len(gating),
        },
    }


def _resumable_ranges(path: Path, pooled) -> list:
    """The seed ranges of a calibration bundle, refused unless it holds the same protocol and one
    range of replicates x samples seeds per group."""
    stored, ranges = runner.load_bundle_protocol(path)
    sizes = {r.stop - r.start for r in ranges}
    if stored.hash != pooled.hash or sizes != {pooled.samples_per_group}:
        raise ValueError(
            f"{path}: not a calibration of this protocol with replicates x samples = "
            f"{pooled.samples_per_group} per group (its ranges hold {sorted(sizes)})"
        )
    return ranges


def _batch_size(replicates: int, workers: int) -> int:
    """Replicates per batch: BATCHES_PER_WORKER batches per worker, at most CHECKPOINT_EVERY."""
    return max(1, min(CHECKPOINT_EVERY, math.ceil(replicates / (workers * BATCHES_PER_WORKER))))


def _map(function: Callable, jobs: list, workers: int) -> list:
    """`function` over `jobs` in order, in `workers` spawned processes (spawned, not forked: the
    parent may hold a CUDA context, which a forked child must not inherit)."""
    if workers == 1:
        return [function(job) for job in jobs]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(function, jobs))


def _evaluate_batch(args: tuple) -> list[dict]:
    """Evaluate a batch of SUT replicates (rows and spans each) of one protocol."""
    protocol, reference, laws, replicates = args
    if protocol.sequential is None:
        return [evaluate(protocol, rows, reference, laws, spans) for rows, spans in replicates]
    return [_evaluate_looks(protocol, reference, laws, rows, spans) for rows, spans in replicates]


def _evaluate_looks(protocol: Protocol, reference: Reference, laws: dict, rows, spans: dict) -> dict:
    """One SUT replicate walked look by look: look k evaluates the replicate's first n_k seeds of
    every group (Monte Carlo keys from those seeds, as a run's look)."""
    starts = rows["group"].map({g: a for g, (a, _) in spans.items()})

    def evaluate_look(look: looks.Look) -> dict:
        size = look.samples_per_group
        head = rows[rows["seed"] < starts + size].reset_index(drop=True)
        return evaluate(
            looks.look_protocol(protocol, look),
            head,
            reference,
            laws,
            {g: (a, a + size) for g, (a, _) in spans.items()},
        )

    return decide_by_looks(protocol, evaluate_look)


def calibrate(
    protocol_file: Path,
    profile: str | None,
    output: Path,
    replicates: int,
    samples: int,
    progress: bool = False,
    resume: Path | None = None,
    workers: int = 1,
) -> tuple[Path, dict]:
    """Collect `replicates` x `samples` per group on fresh seeds and evaluate every replicate.
    `resume` continues a killed calibration in its own bundle (same protocol, replicates and
    samples; complete chunks are kept, the rest collected on the bundle's own seed ranges).
    `workers` processes share the evaluation of the replicates (the collection is the SUT's own);
    the result does not depend on `workers` (each replicate's Monte Carlo streams are seeded by
    its seed ranges)."""
    if replicates < 1 or samples < 1:
        raise ValueError(f"replicates and samples must be >= 1, got replicates={replicates!r}, samples={samples!r}")
    base, protocol, state = runner.prepare(Path(protocol_file), profile, exploratory=True)  # A/A: any state
    check_looks(protocol, samples, protocol_file)
    pooled = dataclasses.replace(protocol, samples_per_group=replicates * samples)
    sut = open_sut(protocol.sut, protocol.num_speculative_tokens)
    try:
        sut.check_groups(protocol.groups)
        if resume is None:
            path, ranges = runner.start(
                Path(protocol_file), base, pooled, Path(output), registration=state, exploratory=state != FROZEN
            )
        else:
            path, ranges = Path(resume), _resumable_ranges(Path(resume), pooled)
        prompt_ids = sut.encode(protocol.prompt)
        collect.collect(sut, pooled, prompt_ids, ranges, path, progress)
        data = collect.load_samples(path, ranges)
        reference = reference_for(sut, protocol, prompt_ids, token_matrix(data, protocol.positions))
        laws = quadrature_laws(sut, protocol, prompt_ids)
    finally:
        sut.close()
    one = dataclasses.replace(protocol, samples_per_group=samples)
    slices, step = _replicates(data, ranges, replicates, samples), _batch_size(replicates, workers)
    jobs = [(one, reference, laws, slices[a : a + step]) for a in range(0, replicates, step)]
    summaries = [s for batch in _map(_evaluate_batch, jobs, workers) for s in batch]
    result = {
        "protocol": protocol.name,
        "hash": protocol.hash,
        "profile": profile,
        "samples_per_group": samples,
        "mode": "sut",
        "workers": workers,
        **_summarise_run(summaries, one),
    }
    bundles.write_json(path / CALIBRATION_FILE, result)
    return path, result


# ---------------------------------------------------------------- exact-sampler calibration


def support_reference(sut, protocol: Protocol, prompt_ids: list[int]) -> Reference:
    """The reference of every prefix an exact sampler can reach: the support tree of t_1..t_{n-1}
    (under the adapter's declared filter semantics)."""
    level, prefixes, semantics = [()], [()], capabilities_of(sut).semantics
    for _ in range(protocol.positions - 1):
        ref = build_reference(sut.target_logits, prompt_ids, level, protocol.sampling, sut.vocab_size, semantics)
        level = [p + (int(t),) for p in level for t in np.flatnonzero(ref.probs(p) > 0.0)]
        prefixes += level
    return build_reference(sut.target_logits, prompt_ids, prefixes, protocol.sampling, sut.vocab_size, semantics)


def exact_counts(reference: Reference, positions: int, n: int, rng: np.random.Generator) -> dict[tuple, np.ndarray]:
    """Counts of the next token after every reached prefix, for n samples drawn straight from the
    float64 reference: prefix -> int64[V]. Drawn level by level as multinomials, which is the
    same law as n independent token sequences and costs O(reached prefixes * V)."""
    tree = {(): rng.multinomial(n, reference.probs(()))}
    frontier = [()]
    for _ in range(positions - 1):
        children = []
        for prefix in frontier:
            for token in np.flatnonzero(tree[prefix]):
                child = prefix + (int(token),)
                tree[child] = rng.multinomial(int(tree[prefix][token]), reference.probs(child))
                children.append(child)
        frontier = children
    return tree


def _exact_replicate(protocol: Protocol, reference: Reference, samples: int, index: int) -> dict:
    """One replicate of the protocol's p-valued criteria on the exact sampler (single stage)."""
    rng = criterion_rng(protocol.hash, EXACT_STREAM, str(index))
    if protocol.sequential is not None:
        return _exact_looks(protocol, reference, samples, index, rng)
    trees = {g.name: exact_counts(reference, protocol.positions, samples, rng) for g in protocol.groups}
    seed_keys = {g: f"{EXACT_STREAM}:{index}:{g}" for g in trees}
    return _exact_tests(protocol, reference, trees, samples, seed_keys)


def _exact_looks(protocol: Protocol, reference: Reference, samples: int, index: int, rng: np.random.Generator) -> dict:
    """One exact replicate walked look by look: each look adds the count trees of its new samples
    per group (independent multinomials: the law of the first n_k of n token sequences) and decides
    them at its level, with Monte Carlo keys of the replicate and the look's size."""
    sized = dataclasses.replace(protocol, samples_per_group=samples, file_hash=protocol.hash)
    trees: dict[str, dict[tuple, np.ndarray]] = {g.name: {} for g in protocol.groups}
    drawn = [0]  # samples per group drawn so far

    def advance(look: looks.Look) -> None:
        for group in trees:
            fresh = exact_counts(reference, protocol.positions, look.samples_per_group - drawn[0], rng)
            for prefix, counts in fresh.items():
                trees[group][prefix] = trees[group].get(prefix, 0) + counts
        drawn[0] = look.samples_per_group

    def evaluate_look(look: looks.Look) -> dict:
        keys = {g: f"{EXACT_STREAM}:{index}:{g}:{look.samples_per_group}" for g in trees}
        return _exact_tests(looks.look_protocol(sized, look), reference, trees, look.samples_per_group, keys)

    return decide_by_looks(sized, evaluate_look, advance)


def _exact_tests(
    protocol: Protocol,
    reference: Reference,
    trees: dict[str, dict[tuple, np.ndarray]],
    samples: int,
    seed_keys: dict[str, str],
) -> dict:
    """The p-valued criteria of count trees of `samples` per group, Holm at the protocol's alpha:
    a summary's `verdict` and `tests` (role, verdict, p-value)."""
    supports = supports_of(reference)

    def source(group: str, position: int, by_path: bool) -> list:
        plain = (SOURCES[0],) * (position - 1)  # the exact sampler draws every token plainly
        return [
            ((prefix, plain) if by_path else prefix, prefix, counts[supports(prefix).tokens], 0)
            for prefix, counts in trees[group].items()
            if len(prefix) == position - 1
        ]

    tests = statistical_tests(protocol, source, dict.fromkeys(trees, samples), supports, seed_keys, with_mde=False)
    _, verdict, _ = decide(tests, protocol)
    return {
        "verdict": verdict,
        "tests": {n: {k: t[k] for k in ("role", "verdict", "p_value")} for n, t in tests.items()},
    }


def _exact_batch(args: tuple) -> list[dict]:
    protocol, reference, samples, start, stop = args
    return [_exact_replicate(protocol, reference, samples, i) for i in range(start, stop)]


def calibrate_exact(
    protocol: Protocol,
    reference: Reference,
    replicates: int,
    samples: int,
    workers: int = 1,
    checkpoint: Callable[[dict], None] | None = None,
) -> dict[str, Any]:
    """A/A calibration of the statistics alone: every group drawn from the exact reference.

    Guarantee: the replicates are independent (data and Monte Carlo streams seeded by the
    replicate index), so each family's FAIL count is Binomial(replicates, its false-fail rate).
    `checkpoint`, if given, receives the summary of the replicates done so far after every round
    of batches (a killed calibration keeps what it measured).
    Scaling: O(replicates * (reached prefixes * V + Monte Carlo draws * cells)); `workers`
    processes share the replicates.
    """
    step = _batch_size(replicates, workers)
    jobs = [(protocol, reference, samples, a, min(a + step, replicates)) for a in range(0, replicates, step)]
    summaries: list[dict] = []
    pool = ProcessPoolExecutor(workers) if workers > 1 else None
    try:
        for first in range(0, len(jobs), workers):
            round_ = jobs[first : first + workers]
            batches = pool.map(_exact_batch, round_) if pool else map(_exact_batch, round_)
            summaries += [s for batch in batches for s in batch]
            result = {
                "protocol": protocol.name,
                "hash": protocol.hash,
                "profile": protocol.profile,
                "mode": "exact",
                "samples_per_group": samples,
                "planned_replicates": replicates,
                **_summarise_run(summaries, dataclasses.replace(protocol, samples_per_group=samples)),
            }
            if checkpoint:
                checkpoint(result)
    finally:
        if pool:
            pool.shutdown()
    return result


def calibrate_exact_file(
    protocol_file: Path, profile: str | None, output: Path, replicates: int, samples: int, workers: int = 1
) -> tuple[Path, dict]:
    """`calibrate_exact` of a protocol file: the support reference from its SUT's target model, the
    result written to <output>/calibration-exact-<protocol>-<profile>-<samples>x<replicates>.json."""
    if replicates < 1 or samples < 1:
        raise ValueError(f"replicates and samples must be >= 1, got replicates={replicates!r}, samples={samples!r}")
    _, protocol, _ = runner.prepare(Path(protocol_file), profile, exploratory=True)  # A/A: any state
    check_looks(protocol, samples, protocol_file)
    sut = open_sut(protocol.sut, protocol.num_speculative_tokens)
    try:
        reference = support_reference(sut, protocol, sut.encode(protocol.prompt))
    finally:
        sut.close()
    path = Path(output) / f"calibration-exact-{protocol.name}-{profile or 'default'}-{samples}x{replicates}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    result = calibrate_exact(
        protocol, reference, replicates, samples, workers, checkpoint=lambda partial: bundles.write_json(path, partial)
    )
    return path, result
