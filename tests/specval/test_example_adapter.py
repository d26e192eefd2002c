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


SPECULATIVE_GROUPS = ("sync", "sync_noisy", "sync_adversarial", "sync_temperature", "sync_mixed")


def test_minimal_adapter_sequence_protocol_passes_with_every_draft_and_verifies(example):
    """The example's whole-sequence protocol (target_logits_along, draft_logits_along under the
    source test, the three draft overrides and a mixed batch through sample_mixed): PASS at its smoke
    size, frozen, and the bundle verifies. False-fail rate <= 0.01 over seed choices (one gating
    family per role at alpha 0.01, Holm)."""
    runner = CliRunner()
    result = runner.invoke(main, ["run", str(example / "sequence.yaml"), "--profile", "smoke", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "PASS: all 57 control and primary criteria passed" in result.output, result.output
    bundle = Path(result.output.strip().splitlines()[-1].removeprefix("bundle: "))
    summary = json.loads((bundle / "summary.json").read_text())
    assert {g["draft"] for g in summary["groups"].values()} == {"own", "noisy", "adversarial", "temperature"}
    assert summary["groups"]["sync_mixed"]["companions"][0]["temperature"] == 0.0  # greedy neighbours
    white_box = {f"{c}.{g}" for c in ("pit_source", "accepts") for g in SPECULATIVE_GROUPS}
    assert white_box | {"companions.sync_mixed"} <= set(summary["tests"])
    assert runner.invoke(main, ["verify", str(bundle)]).exit_code == 0


def test_the_source_test_kills_the_toys_correction_from_p(example):
    """The example's sequence protocol cut to its plain and speculative groups and the pit and
    source tests, through the Python API, once as shipped and once with the toy's planted
    `residual_from_p` (every correction drawn from p instead of max(p - q, 0)): the first PASSes,
    the second FAILs pit_source.sync. Fixed seeds, so both outcomes are fixed on a platform; a
    correct sampler fails with probability <= 0.01 (one primary family at alpha 0.01, Holm)."""
    import specval

    raw = yaml.safe_load((example / "sequence.yaml").read_text())
    raw["groups"] = [g for g in raw["groups"] if g["name"] in ("nospec", "sync")]
    raw["tests"] = [t for t in raw["tests"] if t["kind"] in ("pit", "source")]
    verdicts = {}
    for mutant in (None, "residual_from_p"):
        raw["sut"]["options"] = {"mutant": mutant} if mutant else {}
        path = example / f"source_{mutant}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        verdicts[mutant] = specval.run(path, profile="smoke", exploratory=True, output=f"results_{mutant}")
    assert verdicts[None].passed, verdicts[None].reason
    assert verdicts[None].criterion("accepts.sync").verdict == "PASS"
    planted = verdicts["residual_from_p"]
    assert planted.verdict == "FAIL" and planted.criterion("pit_source.sync").verdict == "FAIL", planted.reason


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
