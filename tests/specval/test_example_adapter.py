"""The plug-in example of docs/harness.md section 8 (examples/adapter_minimal/) runs end to end,
so the guide cannot rot: the shipped protocol PASSes at its smoke size and verifies, and the
adapter's declared capabilities refuse a protocol that asks for top-k before any seed is claimed.

False-fail rate of the PASS assertion: the smoke run has 2 p-valued families at alpha 0.01 and
fixed seeds, so it either always passes or always fails on a given platform; a correct sampler
fails with probability <= 0.02 over seed choices (two gating families at alpha 0.01, Holm within each)."""

from __future__ import annotations

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


def test_minimal_adapter_refuses_top_k_before_any_seed(example):
    raw = yaml.safe_load((example / "protocol.yaml").read_text())
    raw["sampling"]["top_k"] = 4
    (example / "protocol.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    result = CliRunner().invoke(main, ["run", str(example / "protocol.yaml"), "--exploratory", "--quiet"])
    assert result.exit_code == 2 and "sampling='top_k'" in result.output
    assert not seeds.read_ledger("results")
