"""Paired quality runs end to end with a scripted completion SUT: verdicts, bundle, verify, CLI.

The fake SUT answers each arithmetic item correctly or not as a pure function of (request seed,
group): the baseline is right with probability BASE_ACCURACY, and a group with `regression` r turns
each right answer wrong with probability r (paired, same seed). Everything is seeded, so every
outcome below is deterministic; the stated rates say how often a fresh seed would flip it.
The last section sizes the shipped smoke profiles by a Monte Carlo of the paired design.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from specval import bundle as bundles
from specval.cli import main
from specval.protocol import ProtocolError, freeze
from specval.quality import runner as quality
from specval.quality.protocol import load_quality_protocol
from specval.stats.mcnemar import newcombe_paired_ci
from tests.fixtures.quality_sut import ScriptedSUT, protocol_dict

PROTOCOLS = Path(__file__).resolve().parents[3] / "protocols"


def write(tmp_path, raw: dict, name: str = "quality_fake.yaml"):
    """Write the protocol and freeze it next to itself (a pre-registered protocol runs without --exploratory)."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    freeze(path, load_quality_protocol)
    return path


def run(tmp_path, raw, profile=None):
    return quality.run(
        write(tmp_path, raw), profile, tmp_path / "results", progress=False, sut_factory=ScriptedSUT, command=["test"]
    )


def test_no_regression_passes_and_the_bundle_verifies(tmp_path):
    # 400 pairs, 0 discordant: Newcombe's interval collapses to about [0, 0] (with no discordant
    # pair its phi is 1; exactly [0, 0] at accuracy 0.5, +-0.0005 at 190 / 400), far inside margin
    # 0.1 (a fresh seed could not change this: the groups are identical by construction).
    path, summary = run(tmp_path, protocol_dict(200))
    test = summary["tests"]["noninferiority.sync_vs_nospec"]
    assert (summary["verdict"], test["verdict"], test["role"]) == ("PASS", "PASS", "primary")
    assert test["wins"] == test["losses"] == 0 and test["ties"] == 400 and test["p_value"] == 1.0
    assert 0.4 < summary["groups"]["nospec"]["accuracy"] < 0.6
    assert quality.verify(path) == []
    report = (path / "report.md").read_text()
    assert "NOT evidence of no regression" in report and "noninferiority.sync_vs_nospec" in report


def test_tampered_completion_is_caught_by_verify(tmp_path):
    path, _ = run(tmp_path, protocol_dict(20))
    rows = bundles.read_json(path / "samples" / "sync.json")
    rows[0]["completion"] = " 999\n\n" if rows[0]["completion"] != " 999\n\n" else " 998\n\n"
    bundles.write_json(path / "samples" / "sync.json", rows)
    problems = quality.verify(path)
    assert any("samples/sync.json: sha256 differs" in p for p in problems)
    assert any(p.startswith("summary.json:") for p in problems)  # the re-scored summary differs too


def test_quality_samples_are_hashed_as_written_and_a_sealed_bundle_is_not_resumed(tmp_path):
    path, _ = run(tmp_path, protocol_dict(5))
    recorded = bundles.read_chunk_index(path)
    assert recorded == {
        f"samples/{g}.json": bundles.sha256_file(path / "samples" / f"{g}.json") for g in ("nospec", "sync")
    }
    assert bundles.chain_problems(path, bundles.read_json(path / "chunks.json")) == []
    with pytest.raises(bundles.BundleError, match="a sealed bundle is never re-opened"):
        quality.run(None, None, tmp_path / "results", resume=path, progress=False, sut_factory=ScriptedSUT)
    (path / "SHA256SUMS").unlink()  # the laundering door: unseal, tamper, resume to re-seal
    bundles.write_json(path / "samples" / "sync.json", [])
    with pytest.raises(bundles.BundleError, match="the run recorded its verdict and is never collected into again"):
        quality.run(None, None, tmp_path / "results", resume=path, progress=False, sut_factory=ScriptedSUT)
    from specval import api  # `--resume` of a decided bundle only completes it: the chain refuses the edit

    with pytest.raises(bundles.BundleError, match="refusing to complete it.*samples/sync.json: sha256 differs"):
        api.resume(path)  # no system under test is needed to complete a bundle


def test_planted_regression_fails(tmp_path):
    # regression 0.4 on a 0.5-accurate baseline: true diff -0.2, 400 pairs; the 95% interval's upper
    # end lies below -0.1 unless the observed diff is ~2.5 standard errors off (rate < 1%).
    _, summary = run(tmp_path, protocol_dict(200, regression=0.4))
    test = summary["tests"]["noninferiority.sync_vs_nospec"]
    assert summary["verdict"] == "FAIL" and test["verdict"] == "FAIL"
    assert test["losses"] > 0 and test["wins"] == 0 and test["ci_high"] < -0.1
    assert test["p_value"] < 1e-6


def test_wide_interval_is_inconclusive_not_pass(tmp_path):
    # 20 pairs with regression 0.1: the interval is ~+-0.15 wide around a small loss, so it must
    # straddle -0.1 (deterministic for these seeds; at this n it would for almost any seed).
    _, summary = run(tmp_path, protocol_dict(10, regression=0.1))
    test = summary["tests"]["noninferiority.sync_vs_nospec"]
    assert test["ci_low"] < -0.1 < test["ci_high"]
    assert summary["verdict"] == "INCONCLUSIVE" and "not a PASS" in summary["reason"]


def test_cli_dispatches_quality_protocols_and_exits_4_when_inconclusive(tmp_path, monkeypatch):
    # 3 pairs: the interval cannot clear a 0.1 margin (deterministic for these seeds), so INCONCLUSIVE
    monkeypatch.setattr(quality, "open_sut", ScriptedSUT)
    file = write(tmp_path, protocol_dict(10, regression=0.1))
    result = CliRunner().invoke(
        main, ["run", str(file), "--profile", "smoke", "--output", str(tmp_path / "r"), "--quiet"]
    )
    assert result.exit_code == 4 and "INCONCLUSIVE: non-inferiority not established" in result.output, result.output
    bundle = result.output.strip().splitlines()[-1].removeprefix("bundle: ")
    assert bundles.read_json(tmp_path / "r" / "ledger.json")["ranges"][0]["stop"] == 3  # 3 items x 1 seed
    verified = CliRunner().invoke(main, ["verify", bundle])
    assert verified.exit_code == 0 and "verifies" in verified.output


def test_same_seeds_in_every_group_and_fresh_seeds_per_run(tmp_path):
    first, _ = run(tmp_path, protocol_dict(5))
    second, _ = run(tmp_path, protocol_dict(5))
    seeds = [
        [r["seed"] for r in bundles.read_json(path / "samples" / f"{g}.json")]
        for path in (first, second)
        for g in ("nospec", "sync")
    ]
    assert seeds[0] == seeds[1] and seeds[2] == seeds[3]
    assert not set(seeds[0]) & set(seeds[2])


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("margn", 0.1, "margn: unknown key; did you mean 'margin'"),
        ("baseline", "base", "baseline: must be one of"),
        ("margin", 1.5, "margin: must lie in (0, 1)"),
        ("task", {"name": "arith", "metric": "flexible_extract"}, "task.metric: must be one of ['exact']"),
        ("task", {"name": "arith", "metric": "exact", "options": {"num_digit": 2}}, "did you mean 'num_digits'"),
        ("task", {"name": "arith", "metric": "exact", "options": {"num_digits": 0}}, "num_digits"),
        ("profiles", {"smoke": {"samples_per_group": 3}}, "a profile may only set"),
    ],
)
def test_bad_protocol_names_key_and_value(tmp_path, key, value, message):
    raw = protocol_dict(5)
    raw[key] = value
    with pytest.raises(ProtocolError, match=re.escape(message)):
        load_quality_protocol(write(tmp_path, raw))


def test_shipped_quality_protocols_parse():
    for name in ("quality_arith", "quality_gsm8k"):
        protocol = load_quality_protocol(PROTOCOLS / f"{name}.yaml")
        assert protocol.sut.model == "smollm2" and protocol.baseline == "nospec"
        assert [role for role, _, _ in protocol.comparisons()] == ["primary", "primary", "secondary"]


def test_cli_validates_and_freezes_quality_protocols(tmp_path):
    """`validate` and `freeze` parse a quality protocol with its own schema: the shipped ones are
    frozen, a copy freezes into its own lock, and a changed value is reported as changed."""
    runner = CliRunner()
    shipped = runner.invoke(
        main, ["validate", str(PROTOCOLS / "quality_arith.yaml"), str(PROTOCOLS / "quality_gsm8k.yaml")]
    )
    assert shipped.exit_code == 0, shipped.output
    assert shipped.output.count("(frozen)") == 2
    copy = tmp_path / "quality_fake.yaml"
    copy.write_text(yaml.safe_dump(protocol_dict(num_items=4)))
    frozen = runner.invoke(main, ["freeze", str(copy)])
    assert frozen.exit_code == 0, frozen.output
    assert "quality_fake" in (tmp_path / "frozen.lock").read_text()
    copy.write_text(yaml.safe_dump(protocol_dict(num_items=5)))
    changed = runner.invoke(main, ["validate", str(copy)])
    assert changed.exit_code == 1 and "changed since frozen" in changed.output


# ---------------------------------------------------------------- a profile's own margin


def margin_dict(num_items: int, regression: float, margin: float, profile_margin: float) -> dict:
    """protocol_dict whose `smoke` profile runs the full size at its own margin."""
    raw = protocol_dict(num_items, regression=regression, margin=margin)
    raw["profiles"] = {"smoke": {"num_items": num_items, "margin": profile_margin}}
    return raw


@pytest.mark.parametrize(
    "regression, margin, profile_margin, expected",
    [
        # regression 0.04 on a 0.5 baseline (true diff -0.02), 200 pairs: these seeds give 4 losses and
        # no wins, CI [-0.039, -0.001]: it clears -0.1 but straddles -0.03. A fresh seed gives this pair
        # of verdicts iff 3 <= losses <= 13 (losses ~ Bin(200, 0.02)): probability about 0.76.
        (0.04, 0.03, 0.1, ("INCONCLUSIVE", "PASS")),
        # regression 0.4 on a 0.5 baseline (true diff -0.2): 37 losses, CI [-0.237, -0.130], below -0.1
        # (FAIL) and above -0.3 (PASS). A fresh seed: iff 30 <= losses <= 48 of Bin(200, 0.2), about 0.93.
        (0.4, 0.3, 0.1, ("PASS", "FAIL")),
    ],
)
def test_the_profile_margin_decides_the_verdict_summary_report_and_verify(
    tmp_path, regression, margin, profile_margin, expected
):
    """The same data judged at the protocol's margin (no profile) and at the smoke profile's margin:
    the verdict, summary.json, the report and `specval verify`'s recomputation all use the resolved
    profile's margin. Deterministic (ScriptedSUT, fixed seeds); the rates beside each case say how
    often a fresh seed would give the same two verdicts (the margin logic is checked either way)."""
    raw = margin_dict(100, regression, margin, profile_margin)
    (tmp_path / "plain").mkdir(), (tmp_path / "smoke").mkdir()  # two ledgers: both runs draw seeds 0..199
    _, plain = run(tmp_path / "plain", raw)
    path, smoke = run(tmp_path / "smoke", raw, profile="smoke")
    primary = "noninferiority.sync_vs_nospec"
    same = ("wins", "losses", "ties", "ci_low", "ci_high")
    assert [plain["tests"][primary][k] for k in same] == [smoke["tests"][primary][k] for k in same]  # same data
    assert (plain["verdict"], smoke["verdict"]) == expected
    assert (plain["tests"][primary]["margin"], smoke["tests"][primary]["margin"]) == (margin, profile_margin)
    assert (smoke["protocol"]["margin"], smoke["protocol"]["profile"]) == (profile_margin, "smoke")
    assert f"-margin {-profile_margin:+.4f}" in smoke["tests"][primary]["reason"]
    report = (path / "report.md").read_text()
    assert f"non-inferiority margin {profile_margin} against nospec" in report and f"margin {margin} " not in report
    assert quality.verify(path) == []
    verified = CliRunner().invoke(main, ["verify", str(path)])
    assert verified.exit_code == 0 and "verifies" in verified.output, verified.output
    # verify is not vacuous here: recomputed at the protocol's own margin the summary would differ
    protocol, claimed = quality.load_bundle_protocol(path)
    assert protocol.margin == profile_margin and protocol.profile == "smoke"
    unresolved = load_quality_protocol(path / "protocol.yaml")
    assert quality.summarise(path, unresolved, claimed.start)["verdict"] != smoke["verdict"]


# ---------------------------------------------------------------- sizing of the shipped smoke profile

# The paired binomial model of one quality run: nospec answers a unit right with probability
# `accuracy`; each speculative group, if lossless, disagrees with nospec on a unit with probability
# `discordance`, half of it wins and half losses, independently of the other speculative group
# given nospec. The engine makes sync and async token-identical, under which both primary
# comparisons PASS together exactly when one does; independence given nospec gives a lower joint
# PASS rate (E[P(PASS | nospec)^2] <= P(PASS)), so this model is the conservative one.
# quality_arith's discordance: the kept bundle reports/quality_arith-20261201T014331Z (smoke, items
# 0..9, seeds 30..59) has 7 wins and 8 losses in 30 pairs in each primary comparison, 0.5, the
# largest rate seen on this task and about the largest a lossless sampler drawing independently
# of nospec can give at its accuracy (2 acc (1 - acc) = 0.49). Other runs: 8 / 30 (items 0..9,
# seeds 0..29) and the shipped smoke's first run, 111 / 300 = 0.37 (docs/real-model.md).
SMOKE_DISCORDANCE = 0.5
SMOKE_ACCURACY = 13 / 30  # that bundle's nospec accuracy (the smoke's first run: 124 / 300 = 0.41)
LOW_ACCURACY = 8 / 30  # the lowest nospec accuracy seen at T 0.7 (items 0..9, seeds 0..29)
# quality_gsm8k's accuracy seen: 1 / 40 at 256 tokens (sync = async, the probe; nospec 0 / 40); at
# 48 tokens 1 of 50 sync completions and 0 of 50 nospec (the former smoke and a 40-item run); at
# 16 tokens 0 of 120 (the smoke's first run). 0.025 is the largest of these rates.
GSM8K_ACCURACY = 0.025
REPLICATES = 2000


@functools.cache
def table_verdict(both: int, wins: int, losses: int, neither: int, alpha: float, margin: float) -> str:
    """The shipped verdict of one paired table (the run computes the same interval from the flags)."""
    return quality.comparison_verdict(*newcombe_paired_ci(both, wins, losses, neither, alpha), margin)[0]


def simulated_verdicts(protocol, accuracy: float, discordance: float | None, seed: int) -> np.ndarray:
    """REPLICATES run verdicts (`quality.overall` over both primary comparisons) of `protocol`'s size,
    alpha and margin; discordance None: a broken sampler whose answers are all wrong."""
    rng = np.random.default_rng(seed)
    nospec = rng.random((REPLICATES, protocol.num_pairs)) < accuracy
    speculative = []
    for _ in ("sync", "async"):
        if discordance is None:
            speculative.append(np.zeros_like(nospec))
        else:
            draws = rng.random(nospec.shape)
            speculative.append(
                np.where(nospec, draws >= discordance / (2 * accuracy), draws < discordance / (2 * (1 - accuracy)))
            )
    tables = [
        np.stack([(nospec & b).sum(1), (~nospec & b).sum(1), (nospec & ~b).sum(1), (~nospec & ~b).sum(1)], 1)
        for b in speculative
    ]
    verdicts = []
    for row in zip(*tables):
        tests = {
            name: {"role": "primary", "verdict": table_verdict(*map(int, t), protocol.alpha, protocol.margin)}
            for name, t in zip(("sync", "async"), row)
        }
        verdicts.append(quality.overall(tests)[0])
    return np.array(verdicts)


def test_the_shipped_arith_smoke_passes_a_lossless_sampler_and_fails_a_broken_one():
    """quality_arith's smoke profile (300 pairs, margin 0.15) reaches a verdict: PASS for a lossless
    sampler with probability >= 0.9 at the largest discordance seen, FAIL for a sampler whose
    accuracy falls to 0 with probability >= 0.9 at the lowest accuracy seen, while the registered
    margin 0.05 would leave the same smoke INCONCLUSIVE most of the time.
    Monte Carlo of the paired binomial model above, fixed seeds: deterministic. At these seeds the
    PASS rate is 0.9265 (0 FAIL), the broken sampler FAILs 0.9995 of the replicates and the
    0.05-margin PASS rate is 0.11. False-fail rate of this test if the seeds were redrawn: the PASS
    rate of 2,000 replicates has sd sqrt(0.93 x 0.07 / 2000) = 0.0058, so it falls below 0.9 with
    probability about 3e-6 (4.5 sd); the others (0.9995 vs 0.9, 0.11 vs 0.5, 0 vs alpha) are
    farther still. The test fails if the profile is shrunk, its margin dropped or tightened, or
    the verdict rule changed."""
    from specval.quality.protocol import resolve

    shipped = load_quality_protocol(PROTOCOLS / "quality_arith.yaml")
    smoke = resolve(shipped, "smoke")
    lossless = simulated_verdicts(smoke, SMOKE_ACCURACY, SMOKE_DISCORDANCE, seed=20261206)
    assert np.mean(lossless == "PASS") >= 0.9, np.unique(lossless, return_counts=True)
    assert np.mean(lossless == "FAIL") <= smoke.alpha  # <= alpha / 2 per comparison, two comparisons
    broken = simulated_verdicts(smoke, LOW_ACCURACY, None, seed=20261207)
    assert np.mean(broken == "FAIL") >= 0.9, np.unique(broken, return_counts=True)
    registered = dataclasses.replace(smoke, margin=shipped.margin)
    assert np.mean(simulated_verdicts(registered, SMOKE_ACCURACY, SMOKE_DISCORDANCE, seed=20261206) == "PASS") < 0.5


def test_the_shipped_gsm8k_smoke_passes_and_cannot_tell_a_broken_sampler():
    """quality_gsm8k's smoke (40 pairs, margin 0.2) PASSes a lossless sampler with probability >= 0.9
    at the largest accuracy seen (0.025), and, as its protocol comment says, a sampler whose accuracy
    falls to 0 PASSes too: SmolLM2-135M scores about 0 on GSM8K, so no margin this size can resolve
    lies below its accuracy. This pins that limitation: the smoke shows the GSM8K path runs, not
    that accuracy is kept. Monte Carlo as above, fixed seeds: deterministic; at these seeds the
    rates are 0.979 and 0.981 (sd 0.0032 each, 25 sd above 0.9), so a redraw would fail it with
    negligible probability. It fails if the smoke is shrunk below what 0.2 needs or its margin tightened."""
    from specval.quality.protocol import resolve

    smoke = resolve(load_quality_protocol(PROTOCOLS / "quality_gsm8k.yaml"), "smoke")
    discordance = 2 * GSM8K_ACCURACY * (1 - GSM8K_ACCURACY)  # lossless draws independent of nospec
    lossless = simulated_verdicts(smoke, GSM8K_ACCURACY, discordance, seed=20261206)
    assert np.mean(lossless == "PASS") >= 0.9, np.unique(lossless, return_counts=True)
    broken = simulated_verdicts(smoke, GSM8K_ACCURACY, None, seed=20261207)
    assert np.mean(broken == "PASS") >= 0.9, np.unique(broken, return_counts=True)
