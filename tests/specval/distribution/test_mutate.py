"""`specval mutate` on a protocol suite, the real engine, a small fixed subset of mutants at
reduced sizes.

Suite: suite_t1_temperature_top_p and suite_t2_k1_bonus (protocols/suite), cut to the groups
nospec and one speculative group, 600 samples per group, quadrature grid 2^10 (resolution 1e-3;
the kill below is the stop point, which does not depend on the grid). Kills: accept_le by the
stop point (deterministic), bonus_from_q by t2 of the K = 1 protocol (exact TV 0.50 against an
MDE near 0.1 at this size: a miss has probability < 0.2 per criterion and three t2 criteria must
all miss; fixed seeds, so the outcome is fixed), seed_collision by the ledger. The equivalent
mutant runs both protocols and survives unless a gating family rejects a correct law: <= 0.01
per family, 3 families, so <= 0.03 (fixed seeds).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from specval.cli import main
from specval.distribution import laws
from specval.distribution.mutate import (
    SEED_COLLISION,
    _reused_row,
    adapter_mutants,
    expected_outcome,
    reused_uniform_tv,
    suite_files,
    t1_tv,
)
from specval.protocol import load_protocol, lock_path, read_lock, resolve
from specval.sut import open_sut

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "protocols" / "suite"
SUBSET = ("accept_le", "bonus_from_q", "seed_collision", "accept_by_division")
KEEP_GROUPS = {"suite_t1_temperature_top_p": ("nospec", "sync"), "suite_t2_k1_bonus": ("nospec", "sync_d1")}


def _reduced_suite(directory: Path) -> Path:
    directory.mkdir()
    for name, groups in KEEP_GROUPS.items():
        raw = yaml.safe_load((SUITE / f"{name}.yaml").read_text())
        raw["groups"] = [g for g in raw["groups"] if g["name"] in groups]
        raw["tests"] = [t for t in raw["tests"] if set(t.get("groups", groups)) <= set(groups)]
        raw.pop("sequential", None)  # the fixed-size design: every kill below is made on all 600 samples
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return directory


def test_the_suite_directory_lists_its_protocols_in_order(tmp_path):
    assert [f.stem for f in suite_files([SUITE])] == sorted(f.stem for f in SUITE.glob("*.yaml"))
    assert len(suite_files([SUITE, SUITE / "suite_t1_topk_ties.yaml"])) == len(list(SUITE.glob("*.yaml"))) + 1


def test_mutate_a_suite_kills_the_subset_and_spares_the_equivalent_mutant(tmp_path, monkeypatch):
    monkeypatch.setattr(laws, "QUADRATURE_GRID_SIZE", 1 << 10)
    suite = _reduced_suite(tmp_path / "suite")
    args = ["mutate", str(suite), "--samples", "600", "--output", str(tmp_path / "out")]
    for name in SUBSET:
        args += ["--mutant", name]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    table = json.loads(next((tmp_path / "out").glob("*/kill_table.json")).read_text())
    rows = {r["mutant"]: r for r in table["rows"]}
    assert rows["accept_le"]["killed_by"] == ["quadrature.stop_point"]
    assert rows["accept_le"]["killed_in"] == "suite_t1_temperature_top_p"
    bonus = rows["bonus_from_q"]
    assert [run["verdict"] for run in bonus["runs"]] == ["PASS", "FAIL"] and bonus["kill_position"] == "t2"
    assert bonus["tv_at_kill"] > 0.4 > bonus["mde_at_kill"]  # exact TV of (t1, t2) next to the t2 MDE
    assert rows["seed_collision"]["killed_by"] == ["seed_ledger"]
    equivalent = rows["accept_by_division"]
    assert not equivalent["killed"] and [run["verdict"] for run in equivalent["runs"]] == ["PASS", "PASS"]
    assert "| bonus_from_q | no | yes | suite_t2_k1_bonus |" in result.output


def test_every_suite_protocol_is_frozen_at_its_hash():
    lock = read_lock(lock_path(SUITE / "suite_t1_topk_ties.yaml"))
    for file in suite_files([SUITE]):
        assert lock[file.stem] == load_protocol(file).hash, file.name


@pytest.mark.parametrize(
    ("protocol", "mutant", "low", "high"),
    [
        ("suite_t1_temperature_top_p", "temperature_twice", 0.05, 1.0),  # T = 0.7 applied twice
        ("suite_t1_temperature_top_p", "top_p_boundary_excluded", 0.05, 1.0),  # the crossing token dropped
        ("suite_t1_topk_ties", "top_k_ties_dropped", 0.05, 1.0),  # 3 of 4 tied tokens at the 9th value dropped
        ("suite_t1_temperature_top_p", "float32_cdf", 0.0, 1e-6),  # far below every MDE (>= 0.03)
    ],
)
def test_the_suite_exposes_each_mutant_at_t1_by_its_exact_tv(protocol, mutant, low, high):
    # Deterministic (closed-form laws from the model's logits): the premise each suite protocol is
    # built on. The t1 MDEs of these protocols at ci size are 0.031 and 0.054.
    spec = resolve(load_protocol(SUITE / f"{protocol}.yaml"), "ci")
    sut = open_sut(spec.sut, spec.num_speculative_tokens)
    try:
        tvs = list(t1_tv(mutant, sut, spec).values())
    finally:
        sut.close()
    assert all(low <= tv <= high for tv in tvs), tvs


def test_the_engine_adapter_lists_the_engines_mutants_through_the_hook():
    from engine.mutants import ALL_MUTANTS, ENGINE_LAYER

    listed = adapter_mutants("engine")
    engine_side = [m for m in ALL_MUTANTS if m.layer == ENGINE_LAYER]  # the sequence mutants included
    assert [m.name for m in listed] == [m.name for m in engine_side] + [SEED_COLLISION]
    assert [(m.equivalent, m.breaks) for m in listed[:-1]] == [(m.equivalent, m.breaks) for m in engine_side]
    assert [m.name for m in adapter_mutants("engine", ("accept_le", SEED_COLLISION))] == ["accept_le", SEED_COLLISION]
    with pytest.raises(ValueError, match="'no_such_bug': adapter 'engine' does not list it"):
        adapter_mutants("engine", ("no_such_bug",))


def test_a_suite_mixing_adapters_is_refused(tmp_path):
    suite = _reduced_suite(tmp_path / "suite")
    other = suite / "suite_t2_k1_bonus.yaml"
    raw = yaml.safe_load(other.read_text())
    raw["sut"] = {"adapter": "tests.fixtures.fake_sut:FakeSUT"}
    other.write_text(yaml.safe_dump(raw, sort_keys=False))
    result = CliRunner().invoke(main, ["mutate", str(suite), "--output", str(tmp_path / "out")])
    assert (
        result.exit_code == 2
        and "mixes adapters" in result.output
        and "tests.fixtures.fake_sut:FakeSUT" in result.output
    )
    assert not (tmp_path / "out").exists()


def test_the_reused_uniform_law_is_the_simulated_mechanism_and_exact_without_reuse():
    """`_reused_row` against a direct simulation of the mechanism (u ~ U(0, r1) given the first
    accept; the second draft x ~ q2 accepted iff u q2(x) < p2(x), else the residual draw).
    400,000 draws: each cell's frequency has sd <= sqrt(0.25 / 4e5) = 7.9e-4; the bound 5 sd over
    6 cells fails a correct law with probability < 6 * 6e-7. At r1 = 1 (a fresh uniform) the law
    is p2 exactly: the speculative identity, to float64 rounding of six terms (1e-15)."""
    rng = np.random.default_rng(20261201)
    p2, q2 = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    np.testing.assert_allclose(_reused_row(p2, q2, 1.0), p2, rtol=0, atol=1e-15)
    r1, n = 0.3, 400_000
    u, x = rng.random(n) * r1, rng.choice(6, size=n, p=q2)
    residual = np.maximum(p2 - q2, 0.0)
    tokens = np.where(u * q2[x] < p2[x], x, rng.choice(6, size=n, p=residual / residual.sum()))
    frequency = np.bincount(tokens, minlength=6) / n
    assert np.abs(frequency - _reused_row(p2, q2, r1)).max() < 5 * np.sqrt(0.25 / n)
    assert np.abs(_reused_row(p2, q2, r1) - p2).sum() > 0.01  # the premise: reuse changes the law here


@pytest.mark.parametrize(
    ("protocol", "low", "high"),
    [
        ("suite_t2_k2_uniform", 0.03, 1.0),  # built for it: 0.040 at ci size, whose t2 MDE is below that
        ("suite_t3_k3_bonus", 0.0, 0.002),  # T = 0.5, top_k 3: the draft rarely over-proposes; invisible
        ("suite_t2_k1_bonus", 0.0, 0.0),  # K = 1: t2 is the bonus, never a second draft
    ],
)
def test_the_exact_t2_tv_of_a_reused_uniform_per_suite_protocol(protocol, low, high):
    # Deterministic (closed form from the model's logits); the premise of suite_t2_k2_uniform.
    spec = resolve(load_protocol(SUITE / f"{protocol}.yaml"), "ci")
    sut = open_sut(spec.sut, spec.num_speculative_tokens)
    try:
        tvs = list(reused_uniform_tv("uniform_reused", sut, spec).values())
    finally:
        sut.close()
    assert all(low <= tv <= high for tv in tvs) and (tvs or high == 0.0), tvs


def test_a_survivor_acting_beyond_t1_is_never_as_targeted():
    row = {"equivalent": False, "killed": False, "tv_t1": 1e-16, "min_mde_t1": 0.03}
    assert expected_outcome(row | {"visible_at": "t1, by at most ~V * 2**-24"})  # float32_cdf
    assert not expected_outcome(row | {"visible_at": "t2"})  # uniform_reused: its t1 TV says nothing
    assert not expected_outcome(row | {"visible_at": "t_{K+1} after K accepts"})
    assert not expected_outcome(row | {"visible_at": "t1", "tv_t1": 0.05})
