"""`specval mutate` on the real engine, a small fixed subset of mutants at reduced samples.

Protocol: t2_fp32 cut to positions 1 (quadrature + t1 GOF) and groups nospec, sync_d1, 400 samples
per group. Kills here come from deterministic checks (quadrature on the model's own p and q, the
stop-point check, the seed ledger), so they cannot flake. The equivalent mutant survives unless
the t1 GOF control rejects a correct law: probability <= alpha = 0.01 (Holm), fixed seeds.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from specval.cli import main

REPO = Path(__file__).resolve().parents[2]
SUBSET = ("residual_from_p", "accept_le", "seed_collision", "accept_by_division")


def test_mutate_kills_the_subset_and_spares_the_equivalent_mutant(tmp_path):
    raw = yaml.safe_load((REPO / "protocols" / "t2_fp32.yaml").read_text())
    raw.update(positions=1, groups=[g for g in raw["groups"] if g["name"] in ("nospec", "sync_d1")],
               tests=[{"kind": "quadrature", "role": "control", "tol": 1.0e-9},
                      {"kind": "gof", "position": 1, "role": "control"}])
    file = tmp_path / "t1_small.yaml"
    file.write_text(yaml.safe_dump(raw, sort_keys=False))
    args = ["mutate", str(file), "--samples", "400", "--output", str(tmp_path / "out")]
    for name in SUBSET:
        args += ["--mutant", name]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = {r["mutant"]: r for r in json.loads(next((tmp_path / "out").glob("*/kill_table.json")).read_text())["rows"]}
    assert rows["residual_from_p"]["killed"] and "quadrature.sync_d1" in rows["residual_from_p"]["killed_by"]
    assert rows["residual_from_p"]["tv_t1"] > 0.05  # exact TV at t1 for draft_loops 1
    assert rows["accept_le"]["killed_by"] == ["stop_point_check"]
    assert rows["seed_collision"]["killed_by"] == ["seed_ledger"] and rows["seed_collision"]["bundle"] is None
    assert not rows["accept_by_division"]["killed"] and rows["accept_by_division"]["verdict"] == "PASS"
    assert "| residual_from_p | no |" in result.output
