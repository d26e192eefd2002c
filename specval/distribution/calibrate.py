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
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from specval import bundle as bundles
from specval.distribution import collect
from specval.distribution import runner
from specval.protocol import FROZEN, GATING_ROLES, ROLES, Protocol
from specval.distribution.reference import Reference, build_reference
from specval.stats.montecarlo import criterion_rng
from specval.stats.rates import pvalue_uniformity, rate_ci
from specval.sut import SOURCES, capabilities_of, open_sut
from specval.distribution.verdict import FAIL, decide, evaluate, statistical_tests, supports_of

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
    return [(parts.get(i, empty).reset_index(drop=True),
             {g: (start + i * size, start + (i + 1) * size) for g, start in starts.items()})
            for i in range(replicates)]


def summarise(summaries: list[dict], alpha: float) -> dict[str, Any]:
    """Per-criterion FAIL rates (with CI) and p-value uniformity, per family (any criterion of the
    role FAILs: the unit Holm controls at alpha) and the run-level FAIL rate."""
    n = len(summaries)
    criteria = {}
    for name in sorted(summaries[0]["tests"]):
        tests = [s["tests"][name] for s in summaries]
        failures = sum(t["verdict"] == FAIL for t in tests)
        p_values = [t["p_value"] for t in tests if t.get("p_value") is not None]
        row = {"role": tests[0]["role"], "failures": failures, "replicates": n, "rate": failures / n,
               "rate_ci95": list(rate_ci(failures, n, RATE_CI_ALPHA)), "alpha": alpha}
        if p_values:
            row["ks_uniformity"] = pvalue_uniformity(p_values).to_dict()
        criteria[name] = row
    families = {}
    for role in ROLES:
        names = [k for k, t in summaries[0]["tests"].items() if t["role"] == role and t.get("p_value") is not None]
        if names:
            failed = sum(any(s["tests"][k]["verdict"] == FAIL for k in names) for s in summaries)
            families[role] = {"criteria": len(names), "failures": failed, "rate": failed / n,
                              "rate_ci95": list(rate_ci(failed, n, RATE_CI_ALPHA)), "nominal": alpha,
                              "gating": role in GATING_ROLES}
    run_failures = sum(s["verdict"] == FAIL for s in summaries)
    gating = [r for r, f in families.items() if f["gating"]]
    return {"replicates": n, "criteria": criteria, "families": families,
            "run": {"failures": run_failures, "rate": run_failures / n, "rate_ci95": list(rate_ci(run_failures, n)),
                    "bound": alpha * len(gating)}}


def _resumable_ranges(path: Path, pooled) -> list:
    """The seed ranges of a calibration bundle, refused unless it holds the same protocol and one
    range of replicates x samples seeds per group."""
    stored, ranges = runner.load_bundle_protocol(path)
    sizes = {r.stop - r.start for r in ranges}
    if stored.hash != pooled.hash or sizes != {pooled.samples_per_group}:
        raise ValueError(f"{path}: not a calibration of this protocol with replicates x samples = "
                         f"{pooled.samples_per_group} per group (its ranges hold {sorted(sizes)})")
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
    return [evaluate(protocol, rows, reference, laws, spans) for rows, spans in replicates]


def calibrate(protocol_file: Path, profile: str | None, output: Path, replicates: int, samples: int,
              progress: bool = False, resume: Path | None = None, workers: int = 1) -> tuple[Path, dict]:
    """Collect `replicates` x `samples` per group on fresh seeds and evaluate every replicate.
    `resume` continues a killed calibration in its own bundle (same protocol, replicates and
    samples; complete chunks are kept, the rest collected on the bundle's own seed ranges).
    `workers` processes share the evaluation of the replicates (the collection is the SUT's own);
    the result does not depend on `workers` (each replicate's Monte Carlo streams are seeded by
    its seed ranges)."""
    if replicates < 1 or samples < 1:
        raise ValueError(f"replicates and samples must be >= 1, got replicates={replicates!r}, samples={samples!r}")
    base, protocol, state = runner.prepare(Path(protocol_file), profile, exploratory=True)  # A/A: any state
    pooled = dataclasses.replace(protocol, samples_per_group=replicates * samples)
    sut = open_sut(protocol.sut, protocol.num_speculative_tokens)
    try:
        sut.check_groups(protocol.groups)
        if resume is None:
            path, ranges = runner.start(Path(protocol_file), base, pooled, Path(output), registration=state,
                                        exploratory=state != FROZEN)
        else:
            path, ranges = Path(resume), _resumable_ranges(Path(resume), pooled)
        prompt_ids = sut.encode(protocol.prompt)
        collect.collect(sut, pooled, prompt_ids, ranges, path, progress)
        data = collect.load_samples(path, ranges)
        reference = runner.reference_for(sut, protocol, prompt_ids, runner.token_matrix(data, protocol.positions))
        laws = runner.quadrature_laws(sut, protocol, prompt_ids)
    finally:
        sut.close()
    one = dataclasses.replace(protocol, samples_per_group=samples)
    slices, step = _replicates(data, ranges, replicates, samples), _batch_size(replicates, workers)
    jobs = [(one, reference, laws, slices[a : a + step]) for a in range(0, replicates, step)]
    summaries = [s for batch in _map(_evaluate_batch, jobs, workers) for s in batch]
    result = {"protocol": protocol.name, "hash": protocol.hash, "profile": profile, "samples_per_group": samples,
              "mode": "sut", "workers": workers, **summarise(summaries, protocol.alpha)}
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
    trees = {g.name: exact_counts(reference, protocol.positions, samples, rng) for g in protocol.groups}

    supports = supports_of(reference)

    def source(group: str, position: int, by_path: bool) -> list:
        plain = (SOURCES[0],) * (position - 1)  # the exact sampler draws every token plainly
        return [((prefix, plain) if by_path else prefix, prefix, counts[supports(prefix).tokens], 0)
                for prefix, counts in trees[group].items() if len(prefix) == position - 1]

    seed_keys = {g: f"{EXACT_STREAM}:{index}:{g}" for g in trees}
    tests = statistical_tests(protocol, source, {g: samples for g in trees}, supports, seed_keys, with_mde=False)
    _, verdict, _ = decide(tests, protocol)
    return {"verdict": verdict, "tests": {n: {k: t[k] for k in ("role", "verdict", "p_value")} for n, t in tests.items()}}


def _exact_batch(args: tuple) -> list[dict]:
    protocol, reference, samples, start, stop = args
    return [_exact_replicate(protocol, reference, samples, i) for i in range(start, stop)]


def calibrate_exact(protocol: Protocol, reference: Reference, replicates: int, samples: int,
                    workers: int = 1, checkpoint: Callable[[dict], None] | None = None) -> dict[str, Any]:
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
            result = {"protocol": protocol.name, "hash": protocol.hash, "profile": protocol.profile, "mode": "exact",
                      "samples_per_group": samples, "planned_replicates": replicates,
                      **summarise(summaries, protocol.alpha)}
            if checkpoint:
                checkpoint(result)
    finally:
        if pool:
            pool.shutdown()
    return result


def calibrate_exact_file(protocol_file: Path, profile: str | None, output: Path, replicates: int, samples: int,
                         workers: int = 1) -> tuple[Path, dict]:
    """`calibrate_exact` of a protocol file: the support reference from its SUT's target model, the
    result written to <output>/calibration-exact-<protocol>-<profile>-<samples>x<replicates>.json."""
    if replicates < 1 or samples < 1:
        raise ValueError(f"replicates and samples must be >= 1, got replicates={replicates!r}, samples={samples!r}")
    _, protocol, _ = runner.prepare(Path(protocol_file), profile, exploratory=True)  # A/A: any state
    sut = open_sut(protocol.sut, protocol.num_speculative_tokens)
    try:
        reference = support_reference(sut, protocol, sut.encode(protocol.prompt))
    finally:
        sut.close()
    path = Path(output) / f"calibration-exact-{protocol.name}-{profile or 'default'}-{samples}x{replicates}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    result = calibrate_exact(protocol, reference, replicates, samples, workers,
                             checkpoint=lambda partial: bundles.write_json(path, partial))
    return path, result
