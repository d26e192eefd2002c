"""Verdict: the protocol's criteria evaluated on raw samples and stored references, as one
stage's summary (summary.json; docs/harness.md section 3 is the reference).

`evaluate` is a pure function of (protocol, samples, reference, quadrature results, seed ranges):
the run calls it once and `specval verify` calls it again on the bundle, so any hand edit of a
verdict, a statistic or a raw sample shows up as a difference (Monte Carlo draws are seeded by the
protocol hash, the criterion and its seed ranges, so they recompute bit for bit).

The summary is made of the package's parts, and adds each group's facts (seed range, sizes,
acceptance, token sources):

    strata     a group's samples as the statistics see them: valid rows, strata, supports
    criteria   the p-valued criteria (gof, homogeneity): levels, MDEs, coverage, one row each
    checks     the deterministic criteria: validity, the quadrature of the accept rule
    decision   Holm within each family, the run verdict, the two-stage confirmation (`confirm`)
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from specval.distribution.checks import quadrature_criterion, quadrature_names, validity_tests
from specval.distribution.criteria import statistical_tests
from specval.distribution.decision import decide
from specval.distribution.reference import Reference
from specval.distribution.strata import group_data, stratum_counts, supports_of
from specval.protocol import Protocol
from specval.stats import montecarlo

SCHEMA_VERSION = 2  # 2: Monte Carlo p-values, joint small strata, validity criteria, MDE at the Holm level


def _evaluate_tests(
    protocol: Protocol,
    samples: pd.DataFrame,
    ref: Reference | None,
    quadrature: Mapping[str, Mapping],
    ranges: Mapping[str, tuple[int, int]],
    stream: str,
) -> dict[str, dict]:
    vocab = ref.vocab_size if ref is not None else None
    data = {g.name: group_data(samples, g.name, protocol.positions, vocab) for g in protocol.groups}
    tests = validity_tests(protocol, data, ref)
    for test in protocol.tests:
        if test.kind == "quadrature":
            for name in quadrature_names(protocol, test, quadrature):
                tests[f"quadrature.{name}"] = quadrature_criterion(test, name, quadrature[name])

    if ref is None:
        return tests
    supports, memo = supports_of(ref), {}

    def source(group: str, position: int, by_path: bool) -> list:
        if (group, position, by_path) not in memo:
            rows = data[group]
            memo[group, position, by_path] = stratum_counts(
                rows.tokens, position, rows.paths if by_path else None, supports
            )
        return memo[group, position, by_path]

    seed_keys = {g: f"{g}:{ranges[g][0]}-{ranges[g][1]}" for g in data}
    tests.update(
        statistical_tests(
            protocol, source, {g: len(d.tokens) for g, d in data.items()}, supports, seed_keys, stream=stream
        )
    )
    return tests


def group_facts(protocol: Protocol, samples: pd.DataFrame, ranges: Mapping[str, tuple[int, int]]) -> dict:
    """Per group: seed range, planned and effective n, acceptance, token sources by position."""
    facts = {}
    for group in protocol.groups:
        rows = samples[samples["group"] == group.name]
        drafts, accepted = int(rows["num_draft_tokens"].sum()), int(rows["num_accepted_tokens"].sum())
        sources = {
            f"t{k}": {str(s): int(c) for s, c in sorted(rows[f"src{k}"].value_counts().items())}
            for k in range(1, protocol.positions + 1)
        }
        facts[group.name] = {
            "mode": group.mode,
            "draft_loops": group.draft_loops,
            "seed_start": ranges[group.name][0],
            "seed_stop": ranges[group.name][1],
            "planned_n": protocol.samples_per_group,
            "effective_n": int(len(rows)),
            "num_draft_tokens": drafts,
            "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / drafts if drafts else None,
            "num_rounds": int(rows["num_rounds"].sum()),
            "sources": sources,
        }
    return facts


def evaluate(
    protocol: Protocol,
    samples: pd.DataFrame,
    reference: Reference | None,
    quadrature: Mapping[str, Mapping],
    ranges: Mapping[str, tuple[int, int]],
    stream: str = montecarlo.CURRENT_STREAM,
) -> dict:
    """The full summary (see docs/harness.md, "summary.json"): deterministic in its inputs, the
    Monte Carlo `stream` included."""
    tests = _evaluate_tests(protocol, samples, reference, quadrature, ranges, stream)
    families, verdict, reason = decide(tests, protocol)
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": verdict,
        "reason": reason,
        "protocol": {
            "name": protocol.name,
            "hash": protocol.hash,
            "profile": protocol.profile,
            "alpha": protocol.alpha,
            "power": protocol.power,
            "stratum_min": protocol.stratum_min,
            "min_expected": protocol.min_expected,
            "multiplicity": protocol.multiplicity,
            "positions": protocol.positions,
            "samples_per_group": protocol.samples_per_group,
        },
        "groups": group_facts(protocol, samples, ranges),
        "families": families,
        "tests": tests,
    }
