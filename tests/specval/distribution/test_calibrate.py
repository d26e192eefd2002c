"""A/A calibration: the rate and KS arithmetic on known inputs, and a small run on the exact fake SUT.

False-fail rate of the run test: the fake SUT is exact, so each p-valued criterion FAILs a replicate
with probability <= alpha = 0.01 (Holm). With 20 replicates, the assertion "at most 3 FAILs of one
criterion" fails with probability <= 1 - P(Binom(20, 0.01) <= 3) ~ 4e-5 per criterion. Seeds are
fixed (fresh ledger), so the outcome is deterministic.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

from specval.cli import main
from specval.distribution import calibrate as calibration
from specval.distribution import looks
from specval.distribution.decision import FAIL, PASS
from specval.distribution.verdict import evaluate
from specval.stats import montecarlo
from specval.stats.rates import rate_ci
from specval.stats.sequential import POCOCK, Boundary
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

REPLICATES, SAMPLES = 20, 300


def _summary(verdicts: dict[str, tuple[str, float]], run: str) -> dict:
    return {
        "verdict": run,
        "tests": {n: {"role": "primary", "verdict": v, "p_value": p} for n, (v, p) in verdicts.items()},
    }


def test_summarise_counts_rates_intervals_and_uniformity():
    rng = np.random.default_rng(0)
    p = rng.random(100)
    summaries = [_summary({"a": (FAIL if i < 5 else PASS, p[i])}, FAIL if i < 5 else PASS) for i in range(100)]
    result = calibration.summarise(summaries, 0.01)
    row = result["criteria"]["a"]
    assert (row["failures"], row["rate"]) == (5, 0.05)
    low, high = row["rate_ci95"]
    assert low == pytest.approx(0.01643, abs=1e-4) and high == pytest.approx(0.11283, abs=1e-4)  # exact binomial
    assert row["ks_uniformity"]["p_value"] > 0.05  # uniform p-values
    skewed = calibration.summarise([_summary({"a": (PASS, v**4)}, PASS) for v in p], 0.01)
    assert skewed["criteria"]["a"]["ks_uniformity"]["p_value"] < 1e-6
    assert result["run"]["failures"] == 5 and result["run"]["bound"] == 0.01


def test_calibrate_runs_disjoint_replicates_on_the_exact_fake_sut(tmp_path, monkeypatch):
    raw = fake_protocol_dict()
    raw["tests"] = raw["tests"][:3]  # quadrature, t1 gof, t2 gof
    file = write_protocol(tmp_path, raw)
    result = CliRunner().invoke(
        main,
        [
            "calibrate",
            str(file),
            "--replicates",
            str(REPLICATES),
            "--samples",
            str(SAMPLES),
            "--output",
            str(tmp_path / "out"),
            "--quiet",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    path = tmp_path / "out"
    data = __import__("json").loads(next(path.glob("*/calibration.json")).read_text())
    assert data["replicates"] == REPLICATES
    for name, row in data["criteria"].items():
        assert row["failures"] <= 3, (name, row)
    assert data["criteria"]["t1_gof.sync"]["replicates"] == REPLICATES
    ledger = __import__("json").loads((path / "ledger.json").read_text())
    sizes = {r["stop"] - r["start"] for r in (ledger if isinstance(ledger, list) else ledger["ranges"])}
    assert sizes == {REPLICATES * SAMPLES}


def test_calibrate_resume_keeps_the_bundle_and_refuses_other_sizes(tmp_path, monkeypatch):
    """A resumed calibration reuses its bundle's seed ranges and samples (same result, no new ledger
    range); a resume with another replicates x samples is an input error (exit 2)."""
    raw = fake_protocol_dict()
    raw["tests"] = raw["tests"][:2]  # quadrature, t1 gof
    file = write_protocol(tmp_path, raw)
    out = tmp_path / "out"
    args = ["calibrate", str(file), "--replicates", "4", "--samples", str(SAMPLES), "--output", str(out), "--quiet"]
    first = CliRunner().invoke(main, args, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    bundle = next(out.glob("*/calibration.json")).parent
    stored = (bundle / "calibration.json").read_text()
    ledger = (out / "ledger.json").read_text()
    again = CliRunner().invoke(main, args + ["--resume", str(bundle)], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert (bundle / "calibration.json").read_text() == stored
    assert (out / "ledger.json").read_text() == ledger
    shared = CliRunner().invoke(main, args + ["--resume", str(bundle), "--workers", "2"], catch_exceptions=False)
    assert shared.exit_code == 0, shared.output  # the evaluation shared by two processes: the same numbers
    assert _without_workers(bundle / "calibration.json") == _without_workers_text(stored)
    other = CliRunner().invoke(main, args[:3] + ["5"] + args[4:] + ["--resume", str(bundle)])
    assert other.exit_code == 2 and "not a calibration" in other.output


def _without_workers_text(text: str) -> dict:
    data = __import__("json").loads(text)
    data.pop("workers")
    return data


def _without_workers(path) -> dict:
    return _without_workers_text(path.read_text())


def test_exact_sampler_calibration_reports_families_and_can_see_an_inflated_test(tmp_path, monkeypatch):
    """--exact draws every group from the float64 reference (count trees): per-family FAIL counts
    are Binomial(replicates, <= alpha). 40 replicates: "at most 3 FAILs of a family" fails with
    probability <= 1 - P(Binom(40, 0.01) <= 3) ~ 8e-4 per family (three families)."""
    file = write_protocol(tmp_path, fake_protocol_dict(tests=fake_protocol_dict()["tests"][1:]))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        ["calibrate", str(file), "--exact", "--replicates", "40", "--samples", "300", "--output", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    data = __import__("json").loads(next(out.glob("calibration-exact-*.json")).read_text())
    assert data["mode"] == "exact" and data["replicates"] == 40
    assert set(data["families"]) == {"control", "primary", "secondary"}
    assert all(f["failures"] <= 3 for f in data["families"].values()), data["families"]
    assert "family primary:" in result.output and "run:" in result.output


def test_summarise_family_rate_is_any_criterion_of_the_role():
    both = {"a": (FAIL, 0.001), "b": (FAIL, 0.002)}
    one = {"a": (PASS, 0.5), "b": (FAIL, 0.002)}
    none = {"a": (PASS, 0.5), "b": (PASS, 0.7)}
    result = calibration.summarise([_summary(both, FAIL), _summary(one, FAIL), _summary(none, PASS)], 0.01)
    assert result["families"]["primary"]["failures"] == 2 and result["families"]["primary"]["nominal"] == 0.01


# ---------------------------------------------------------------- protocols with sequential looks

LOOKS = [0.1, 0.25, 0.5, 1.0]
LOOK_ALPHA = 0.2  # large on purpose: FAILs are frequent, so a few hundred replicates resolve the rate
LOOK_SAMPLES = 500  # looks at 50, 125, 250, 500 per group, each decided at 0.2 / 4 = 0.05 (Pocock)
LOOK_CI_ALPHA = 0.01  # 99% Clopper-Pearson intervals


def _looks_protocol(tmp_path, alpha: float = LOOK_ALPHA):
    """The t1 gof of both groups (one control family of 2 criteria) with looks at 10/25/50/100 %."""
    raw = fake_protocol_dict(
        alpha=alpha, tests=[{"kind": "gof", "position": 1, "role": "control"}], sequential={"looks": LOOKS}
    )
    return write_protocol(tmp_path, raw)


def _exact_with_looks(tmp_path, replicates: int) -> tuple[dict, str]:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        [
            "calibrate",
            str(_looks_protocol(tmp_path)),
            "--exact",
            "--replicates",
            str(replicates),
            "--samples",
            str(LOOK_SAMPLES),
            "--output",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return json.loads(next(out.glob("calibration-exact-*.json")).read_text()), result.output


def test_exact_calibration_with_looks_keeps_alpha_over_the_looks(tmp_path):
    """300 exact A/A replicates of a protocol with looks (alpha 0.2, Pocock over 10/25/50/100 % of
    500 per group), each walked as a run walks its looks. Measured (these seeds: the protocol's hash
    and the replicate index): run 43/300 = 0.143, stops per look 11/11/11/267, 9 s on one core.

    Statistical assertions: the run's 99% interval reaches alpha or below (false-fail rate <= 0.005
    if the rule keeps alpha; every look at the full alpha gives ~0.43, next test, and FAILs it), and
    some replicate stops before the last look (none does with probability < 1e-15 at the measured
    11% early-stop rate; a calibration that ignores the looks has no looks at all). The rest is
    deterministic bookkeeping: every replicate stops at one look, early stops are FAILs, and the
    family-wise rate over looks is the run's (one gating family)."""
    data, output = _exact_with_looks(tmp_path, 300)
    run, stops = data["run"], data["sequential"]["looks"]
    low, _ = rate_ci(run["failures"], data["replicates"], LOOK_CI_ALPHA)
    assert low <= LOOK_ALPHA, run
    assert [s["samples_per_group"] for s in stops] == [50, 125, 250, 500]
    assert [s["level"] for s in stops] == [LOOK_ALPHA / 4] * 4
    assert sum(s["stopped"] for s in stops) == 300 and sum(s["stopped"] for s in stops[:-1]) > 0
    assert all(s["failures"] == s["stopped"] for s in stops[:-1])
    assert sum(s["failures"] for s in stops) == run["failures"] == data["families"]["control"]["failures"]
    assert all(row["failures"] <= run["failures"] for row in data["criteria"].values())
    assert f"look 1 ({stops[0]['samples_per_group']} per group, level 0.05): {stops[0]['stopped']}/300" in output


def test_exact_calibration_sees_looks_taken_at_the_full_alpha(tmp_path, monkeypatch):
    """The planted bug the previous test catches: every look decided at the full alpha (no spending).
    Measured (these seeds): 65/150 = 0.43 FAIL, far above alpha = 0.2; the 99% interval's lower end
    stays above alpha with probability > 1 - 1e-6 at a true rate of 0.43 (5 sd). A calibration that
    ignored the looks would measure ~0.16 (one look at alpha) and fail this test."""

    def naive(alpha, fractions, spending=POCOCK):
        return Boundary(alpha, "none", tuple(fractions), (alpha,) * len(fractions))

    monkeypatch.setattr(looks, "spend", naive)
    data, _ = _exact_with_looks(tmp_path, 150)
    low, _ = rate_ci(data["run"]["failures"], data["replicates"], LOOK_CI_ALPHA)
    assert low > LOOK_ALPHA, data["run"]


def test_sut_calibration_decides_each_look_on_the_first_seeds_at_its_level(tmp_path, monkeypatch):
    """Deterministic: in SUT mode, look k of replicate i evaluates exactly the seeds
    [start_g + i S, start_g + i S + n_k) of every group g, at the look's level, with those seeds as
    its span (the run's Monte Carlo keys)."""
    calls = []

    def spy(protocol, rows, reference, laws, spans, *args):
        seeds = {g: (int(r["seed"].min()), int(r["seed"].max()) + 1, len(r)) for g, r in rows.groupby("group")}
        calls.append((protocol.alpha, protocol.samples_per_group, seeds, spans))
        return evaluate(protocol, rows, reference, laws, spans, *args)

    monkeypatch.setattr(calibration, "evaluate", spy)
    file = _looks_protocol(tmp_path, alpha=0.01)
    result = CliRunner().invoke(
        main,
        ["calibrate", str(file), "--replicates", "2", "--samples", "40", "--output", str(tmp_path / "out"), "--quiet"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert len(calls) == 8  # a correct SUT at alpha 0.01 walks all four looks of both replicates
    sizes = [4, 10, 20, 40]
    for call, (replicate, k) in zip(calls, [(i, k) for i in range(2) for k in range(4)]):
        alpha, size, seeds, spans = call
        assert (alpha, size) == (0.01 / 4, sizes[k])
        for group, (first, stop, rows) in seeds.items():
            start = spans[group][0]
            assert (first, stop, rows) == (start, start + sizes[k], sizes[k]) == (start, spans[group][1], rows)
            assert (start - calls[0][3][group][0]) == replicate * 40


def test_sut_calibration_with_looks_stops_a_planted_bug_at_the_first_look(tmp_path):
    """Deterministic: the accept-kernel bug FAILs the quadrature check (no randomness) at look 1, so
    every replicate stops there, as the run does (tests/specval/distribution/test_looks.py)."""
    raw_sut = {"adapter": "tests.fixtures.fake_sut:BuggyFakeSUT"}
    file = write_protocol(
        tmp_path, fake_protocol_dict(sut=raw_sut, tests=fake_protocol_dict()["tests"][:2], sequential={"looks": LOOKS})
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        ["calibrate", str(file), "--replicates", "3", "--samples", "100", "--output", str(out), "--quiet"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(next(out.glob("*/calibration.json")).read_text())
    assert [(s["stopped"], s["failures"]) for s in data["sequential"]["looks"]] == [(3, 3), (0, 0), (0, 0), (0, 0)]
    assert data["run"]["failures"] == 3 and data["criteria"]["quadrature.adversarial"]["failures"] == 3


@pytest.mark.parametrize("exact", [True, False])
def test_too_few_samples_for_the_looks_is_one_line_naming_samples_and_file(tmp_path, exact):
    """Deterministic: 3 samples per replicate give looks of 1, 1, 2, 3: an input error (exit 2) before
    any seed is claimed."""
    file = _looks_protocol(tmp_path)
    args = ["calibrate", str(file), "--replicates", "2", "--samples", "3", "--output", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args + (["--exact"] if exact else []))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--samples 3" in lines[0] and str(file) in lines[0] and "sequential.looks" in lines[0]
    assert not (tmp_path / "out" / "ledger.json").exists()


# The calibration.json of a protocol without looks, computed by the code before looks were decided
# (commit da21bed, alpha 0.2 so that some replicates FAIL): sha256 of its JSON with sorted keys.
# Family and run FAIL counts beside it, to read a difference by.
NO_LOOKS_GOLDEN = {
    True: (
        "e69b475a79d879d13fbf6a67bee17c76b26592250bc934dcb7eef5a94ed60ddd",
        {"control": 1, "primary": 2, "secondary": 1},
        3,
    ),
    False: ("88a472b0e97db91300747973c726f2ae4f1e5b658caef3b64b1fe40242a95d77", {"control": 1, "primary": 3}, 3),
}


@pytest.mark.parametrize("exact", [True, False])
def test_a_protocol_without_looks_calibrates_as_before(tmp_path, exact, monkeypatch):
    """Deterministic (fixed seeds: the protocol's hash and a fresh ledger): the same calibration.json,
    byte for byte up to key order, as before looks were decided; exact mode 8 x 300 on three families,
    SUT mode 8 x 300 on the quadrature and t1/t2 gof. The golden values were drawn with stream
    version 2, so the current stream's name draws version 2's transforms here."""
    monkeypatch.setitem(montecarlo.VERSIONS, montecarlo.CURRENT_STREAM, 2)
    raw = fake_protocol_dict(alpha=0.2)
    raw["tests"] = raw["tests"][1:] if exact else raw["tests"][:3]
    out = tmp_path / "out"
    args = [
        "calibrate",
        str(write_protocol(tmp_path, raw)),
        "--replicates",
        "8",
        "--samples",
        "300",
        "--output",
        str(out),
        "--quiet",
    ]
    result = CliRunner().invoke(main, args + (["--exact"] if exact else []), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(next(out.glob("calibration-exact-*.json" if exact else "*/calibration.json")).read_text())
    digest, families, run = NO_LOOKS_GOLDEN[exact]
    assert ({k: f["failures"] for k, f in data["families"].items()}, data["run"]["failures"]) == (families, run)
    assert "sequential" not in data
    assert hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest() == digest
