"""The plug-in example of docs/harness.md section 8 (examples/adapter_minimal/) runs end to end,
so the guide cannot rot: the shipped protocol PASSes at its smoke size and verifies, and the
adapter's declared capabilities refuse a protocol that asks for top-k before any seed is claimed.

False-fail rate of the PASS assertion: the smoke run has 2 p-valued families at alpha 0.01 and
fixed seeds, so it either always passes or always fails on a given platform; a correct sampler
fails with probability <= 0.02 over seed choices (two gating families at alpha 0.01, Holm within each)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from specval import seeds
from specval.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "adapter_minimal"


@pytest.fixture
def example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    yield copy
    sys.modules.pop("toy_adapter", None)


def test_minimal_adapter_example_passes_and_verifies(example):
    runner = CliRunner()
    result = runner.invoke(main, ["run", str(example / "protocol.yaml"), "--profile", "smoke", "--quiet"])
    assert result.exit_code == 0, result.output
    assert re.search(r"^PASS: all \d+ control and primary criteria passed$", result.output, re.M), result.output
    bundle = Path(result.output.strip().splitlines()[-1].removeprefix("bundle: "))
    assert runner.invoke(main, ["verify", str(bundle)]).exit_code == 0


def test_minimal_adapter_sequence_protocol_passes_with_every_draft_and_verifies(example):
    """The example's whole-sequence protocol (target_logits_along and the three draft overrides of
    the toy adapter): PASS at its smoke size, frozen, and the bundle verifies. False-fail rate <= 0.01
    over seed choices (one gating family per role at alpha 0.01, Holm)."""
    runner = CliRunner()
    result = runner.invoke(main, ["run", str(example / "sequence.yaml"), "--profile", "smoke", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "PASS: all 40 control and primary criteria passed" in result.output, result.output
    bundle = Path(result.output.strip().splitlines()[-1].removeprefix("bundle: "))
    summary = json.loads((bundle / "summary.json").read_text())
    assert {g["draft"] for g in summary["groups"].values()} == {"own", "noisy", "adversarial", "temperature"}
    assert runner.invoke(main, ["verify", str(bundle)]).exit_code == 0


def test_minimal_adapter_refuses_top_k_before_any_seed(example):
    raw = yaml.safe_load((example / "protocol.yaml").read_text())
    raw["sampling"]["top_k"] = 4
    (example / "protocol.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    result = CliRunner().invoke(main, ["run", str(example / "protocol.yaml"), "--exploratory", "--quiet"])
    assert result.exit_code == 2 and "sampling='top_k'" in result.output
    assert not seeds.read_ledger("results")


# ---------------------------------------------------------------- mutants of any adapter

MUTATE_SAMPLES = "1000"  # per group: the kill below is by the deterministic quadrature, the rest is a check
MUTATE_GRID = 1 << 10  # quadrature resolution 1e-3: residual_from_p moves far more mass at t1 (the sweep is exact)


def _kill_rows(result, output: Path) -> dict[str, dict]:
    assert result.exit_code == 0, result.output
    table = next(output.glob("mutate-*/kill_table.json"))
    return {r["mutant"]: r for r in json.loads(table.read_text())["rows"]}


def test_mutate_runs_the_example_adapters_mutants_with_any_number_of_workers(example, monkeypatch):
    """False-fail rate: the equivalent mutant survives unless a gating family of its one run rejects a
    correct law, <= 0.02 (two p-valued families at alpha 0.01); fixed seeds (each mutant's own ledger),
    so the outcome is fixed and identical for 1 and 2 workers."""
    from specval.distribution import laws

    monkeypatch.setattr(laws, "QUADRATURE_GRID_SIZE", MUTATE_GRID)  # forked workers inherit it
    cli = CliRunner()
    tables = []
    for workers in ("1", "2"):
        output = Path(f"out{workers}")
        result = cli.invoke(
            main,
            [
                "mutate",
                str(example / "protocol.yaml"),
                "--samples",
                MUTATE_SAMPLES,
                "--output",
                str(output),
                "--workers",
                workers,
            ],
        )
        tables.append(_kill_rows(result, output))
    rows = tables[0]
    assert list(rows) == ["residual_from_p", "accept_by_division", "seed_collision"]  # adapter's, then harness's
    assert rows["residual_from_p"]["killed"] and "quadrature.sync" in rows["residual_from_p"]["killed_by"]
    assert not rows["accept_by_division"]["killed"] and rows["accept_by_division"]["equivalent"]
    assert rows["seed_collision"]["killed_by"] == ["seed_ledger"]
    assert all(r["as_expected"] and r["tv_t1"] is None for r in rows.values())  # no closed form: n/a
    assert "| n/a (t1) |" in next(Path("out1").glob("mutate-*/kill_table.md")).read_text()
    assert list(tables[1]) == list(rows)
    for name, row in rows.items():
        other = tables[1][name]
        assert (row["killed"], row["killed_by"], row["killed_in"]) == (
            other["killed"],
            other["killed_by"],
            other["killed_in"],
        ), name
        assert [c["verdict"] for c in row["runs"]] == [c["verdict"] for c in other["runs"]], name


def test_a_mutant_the_adapter_does_not_list_is_a_usage_error(example):
    result = CliRunner().invoke(main, ["mutate", str(example / "protocol.yaml"), "--mutant", "ratio_inverted"])
    assert result.exit_code == 2
    assert "'ratio_inverted'" in result.output and "'toy_adapter:ToySUT'" in result.output
    assert not Path("results").exists() or not list(Path("results").glob("mutate-*"))
