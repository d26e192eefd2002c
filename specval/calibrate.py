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
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from specval import bundle as bundles
from specval import collect, runner
from specval.protocol import GATING_ROLES, Protocol
from specval.stats.rates import pvalue_uniformity, rate_ci
from specval.sut import open_sut
from specval.verdict import FAIL, evaluate

CALIBRATION_FILE = "calibration.json"
RATE_CI_ALPHA = 0.05  # the rate intervals are 95%


def _replicate(samples, protocol: Protocol, ranges, index: int, size: int):
    """Rows of replicate `index` (seed slice of `size` per group) and its spans."""
    spans = {r.group: (r.start + index * size, r.start + (index + 1) * size) for r in ranges}
    lo = samples["group"].map({g: s[0] for g, s in spans.items()})
    hi = samples["group"].map({g: s[1] for g, s in spans.items()})
    return samples[(samples["seed"] >= lo) & (samples["seed"] < hi)], spans


def summarise(summaries: list[dict], alpha: float) -> dict[str, Any]:
    """Per-criterion FAIL rates (with CI) and p-value uniformity, and the run-level FAIL rate."""
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
    run_failures = sum(s["verdict"] == FAIL for s in summaries)
    families = {t["role"] for t in summaries[0]["tests"].values() if t["role"] in GATING_ROLES}
    return {"replicates": n, "criteria": criteria,
            "run": {"failures": run_failures, "rate": run_failures / n, "rate_ci95": list(rate_ci(run_failures, n)),
                    "bound": alpha * len(families)}}


def _resumable_ranges(path: Path, pooled) -> list:
    """The seed ranges of a calibration bundle, refused unless it holds the same protocol and one
    range of replicates x samples seeds per group."""
    stored, ranges = runner.load_bundle_protocol(path)
    sizes = {r.stop - r.start for r in ranges}
    if stored.hash != pooled.hash or sizes != {pooled.samples_per_group}:
        raise ValueError(f"{path}: not a calibration of this protocol with replicates x samples = "
                         f"{pooled.samples_per_group} per group (its ranges hold {sorted(sizes)})")
    return ranges


def calibrate(protocol_file: Path, profile: str | None, output: Path, replicates: int, samples: int,
              progress: bool = False, resume: Path | None = None) -> tuple[Path, dict]:
    """Collect `replicates` x `samples` per group on fresh seeds and evaluate every replicate.
    `resume` continues a killed calibration in its own bundle (same protocol, replicates and
    samples; complete chunks are kept, the rest collected on the bundle's own seed ranges)."""
    if replicates < 1 or samples < 1:
        raise ValueError(f"replicates and samples must be >= 1, got replicates={replicates!r}, samples={samples!r}")
    base, protocol = runner.prepare(Path(protocol_file), profile)
    pooled = dataclasses.replace(protocol, samples_per_group=replicates * samples)
    sut = open_sut(protocol.sut, protocol.num_speculative_tokens)
    try:
        sut.check_groups(protocol.groups)
        if resume is None:
            path, ranges = runner.start(Path(protocol_file), base, pooled, Path(output))
        else:
            path, ranges = Path(resume), _resumable_ranges(Path(resume), pooled)
        prompt_ids = sut.encode(protocol.prompt)
        collect.collect(sut, pooled, prompt_ids, ranges, path, progress)
        data = collect.load_samples(path, ranges)
        reference = runner._reference(sut, protocol, prompt_ids, runner._token_matrix(data, protocol.positions))
        laws = runner.quadrature_laws(sut, protocol, prompt_ids)
    finally:
        sut.close()
    one = dataclasses.replace(protocol, samples_per_group=samples)
    summaries = []
    for i in range(replicates):
        rows, spans = _replicate(data, protocol, ranges, i, samples)
        summaries.append(evaluate(one, rows.reset_index(drop=True), reference, laws, spans))
    result = {"protocol": protocol.name, "hash": protocol.hash, "profile": profile, "samples_per_group": samples,
              **summarise(summaries, protocol.alpha)}
    bundles.write_json(path / CALIBRATION_FILE, result)
    return path, result
