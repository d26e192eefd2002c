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

import pytest
import yaml
from click.testing import CliRunner

from specval import runner
from specval.cli import main
from specval.mutate import SEED_COLLISION, adapter_mutants, suite_files, t1_tv
from specval.protocol import load_protocol, lock_path, read_lock, resolve
from specval.sut import open_sut

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "protocols" / "suite"
SUBSET = ("accept_le", "bonus_from_q", "seed_collision", "accept_by_division")
KEEP_GROUPS = {"suite_t1_temperature_top_p": ("nospec", "sync"), "suite_t2_k1_bonus": ("nospec", "sync_d1")}


def _reduced_suite(directory: Path) -> Path:
    directory.mkdir()
    for name, groups in KEEP_GROUPS.items():
        raw = yaml.safe_load((SUITE / f"{name}.yaml").read_text())
        raw["groups"] = [g for g in raw["groups"] if g["name"] in groups]
        raw["tests"] = [t for t in raw["tests"] if set(t.get("groups", groups)) <= set(groups)]
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return directory


def test_the_suite_directory_lists_its_protocols_in_order(tmp_path):
    assert [f.stem for f in suite_files([SUITE])] == sorted(f.stem for f in SUITE.glob("*.yaml"))
    assert len(suite_files([SUITE, SUITE / "suite_t1_topk_ties.yaml"])) == len(list(SUITE.glob("*.yaml"))) + 1


def test_mutate_a_suite_kills_the_subset_and_spares_the_equivalent_mutant(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "QUADRATURE_GRID_SIZE", 1 << 10)
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


@pytest.mark.parametrize(("protocol", "mutant", "low", "high"), [
    ("suite_t1_temperature_top_p", "temperature_twice", 0.05, 1.0),  # T = 0.7 applied twice
    ("suite_t1_temperature_top_p", "top_p_boundary_excluded", 0.05, 1.0),  # the crossing token dropped
    ("suite_t1_topk_ties", "top_k_ties_dropped", 0.05, 1.0),  # 3 of 4 tied tokens at the 9th value dropped
    ("suite_t1_temperature_top_p", "float32_cdf", 0.0, 1e-6),  # far below every MDE (>= 0.03)
])
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
    from engine.mutants import ENGINE_LAYER, MUTANTS

    listed = adapter_mutants("engine")
    engine_side = [m for m in MUTANTS if m.layer == ENGINE_LAYER]
    assert [m.name for m in listed] == [m.name for m in engine_side] + [SEED_COLLISION]
    assert [(m.equivalent, m.breaks) for m in listed[:-1]] == [(m.equivalent, m.breaks) for m in engine_side]
    assert [m.name for m in adapter_mutants("engine", ("accept_le", SEED_COLLISION))] == ["accept_le", SEED_COLLISION]
    with pytest.raises(ValueError, match="'no_such_bug': adapter 'engine' does not list it"):
        adapter_mutants("engine", ("no_such_bug",))


def test_a_suite_mixing_adapters_is_refused(tmp_path):
    suite = _reduced_suite(tmp_path / "suite")
    other = suite / "suite_t2_k1_bonus.yaml"
    raw = yaml.safe_load(other.read_text())
    raw["sut"] = {"adapter": "fake_sut:FakeSUT"}
    other.write_text(yaml.safe_dump(raw, sort_keys=False))
    result = CliRunner().invoke(main, ["mutate", str(suite), "--output", str(tmp_path / "out")])
    assert result.exit_code == 2 and "mixes adapters" in result.output and "fake_sut:FakeSUT" in result.output
    assert not (tmp_path / "out").exists()
