"""One frozen protocol across the settings a team serves with (issue 56): the bundled engine runs
each group with its own options (`sut.options` with the group's merged over them), one engine per
option set; the shipped `suite_t2_token_budget` PASSes the correct engine in both token budgets and
FAILs a mutant that misbehaves in one budget only, in that budget's cells only; the manifest and
the report's first screen list the settings covered.

Statistics: the smoke runs use the protocol's own fixed seeds (a frozen run in a fresh output root
starts at its seed_base; the mutant's copy runs exploratory seeds, fixed too), so each outcome is
fixed. A correct engine FAILs the primary family with probability <= alpha = 0.01 (Holm over 12
criteria, Pocock looks at alpha / 4 each); the controls are deterministic. The mutant puts 18 % of
t1's mass outside the top 5 in the budget cells (`mixed_step_unfiltered`; `specval plan` MDE 0.085
at smoke size), so its first look already holds out-of-support tokens (a deterministic FAIL).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from specval.adapters.engine import EngineSUT
from specval.cli import main
from specval.protocol import GroupSpec, SamplingSpec, SutSpec, load_protocol, lock_path, read_lock

REPO = Path(__file__).resolve().parents[3]
BUDGET = REPO / "protocols" / "suite" / "suite_t2_token_budget.yaml"
MUTANT = "mixed_step_unfiltered"
DEFAULT_CELLS, BUDGET_CELLS = ("nospec", "sync"), ("nospec_budget", "sync_budget")
SAMPLING = SamplingSpec(temperature=1.0, top_k=5)
SEEDS = np.arange(40, dtype=np.int64)  # 40 requests of 16 prompt tokens: a 256-token step admits 13


def _cells(sut: EngineSUT) -> tuple[GroupSpec, GroupSpec, GroupSpec]:
    sync = GroupSpec("sync", "sync", 2)
    budget = GroupSpec("sync_budget", "sync", 2, options=(("max_num_batched_tokens", 256),))
    twin = GroupSpec("sync_budget_twin", "sync", 2, options=(("max_num_batched_tokens", 256),))
    sut.check_groups((sync, budget, twin))
    return sync, budget, twin


def _tokens(sut: EngineSUT, group: GroupSpec) -> np.ndarray:
    prompt = sut.encode("Once upon a time")
    return sut.sample(group, prompt, SAMPLING, SEEDS, 2, 5).tokens


@pytest.mark.parametrize("mutant", [None, MUTANT])
def test_each_group_runs_an_engine_of_its_own_options(mutant):
    """Deterministic: a request's tokens are a pure function of its seed whatever the batching, so
    the correct engine gives equal tokens in both budgets, and the mutant (set in sut.options,
    acting only where a step admits beside decoding requests) changes the budget cell's only."""
    options = (("max_num_batched_tokens", 65536),) + ((("mutant", mutant),) if mutant else ())
    sut = EngineSUT(SutSpec(options=options), 3)
    try:
        sync, budget, twin = _cells(sut)
        default, capped = _tokens(sut, sync), _tokens(sut, budget)
        configs = sut.describe()["configs"]
    finally:
        sut.close()
    assert (default == capped).all() == (mutant is None)
    assert len(configs) == 2 and configs[0] == "sync/draft_loops=2"  # the twin shares its cell's engine
    assert configs[1].startswith('sync/draft_loops=2/options={"max_num_batched_tokens":256')


def test_an_option_the_engine_refuses_is_an_input_error_naming_the_group(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load(BUDGET.read_text())
    raw["groups"][3]["options"] = {"max_num_batched_tokens": 2}
    path = tmp_path / "protocol.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    result = CliRunner().invoke(main, ["run", str(path), "--exploratory", "--quiet"])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert f"{path}: sut: group 'sync_budget': engine refuses mode='sync'" in line
    assert "max_num_batched_tokens=2 is invalid" in line and not (tmp_path / "results").exists()


def test_the_shipped_budget_protocol_is_frozen_and_covers_two_budgets():
    protocol = load_protocol(BUDGET)
    assert read_lock(lock_path(BUDGET))[protocol.name] == protocol.hash
    budgets = {g.name: dict(protocol.sut.options_for(g))["max_num_batched_tokens"] for g in protocol.groups}
    assert budgets == {"nospec": 65536, "sync": 65536, "nospec_budget": 256, "sync_budget": 256}


def _run(args: list[str]) -> tuple[int, Path]:
    result = CliRunner().invoke(main, ["run", *args, "--profile", "smoke", "--quiet"])
    bundle = Path(result.output.strip().splitlines()[-1].removeprefix("bundle: "))
    return result.exit_code, bundle


def test_the_mutant_fails_the_budget_cells_only(tmp_path):
    raw = yaml.safe_load(BUDGET.read_text())
    raw["sut"]["options"]["mutant"] = MUTANT
    copy = tmp_path / "mutated.yaml"
    copy.write_text(yaml.safe_dump(raw, sort_keys=False))
    code, bundle = _run([str(copy), "--exploratory", "--output", str(tmp_path / "out")])
    summary = json.loads((bundle / "summary.json").read_text())
    failed = [name for name, test in summary["tests"].items() if test["verdict"] == "FAIL"]
    assert code == 1 and summary["verdict"] == "FAIL"
    assert {"t1_gof.nospec_budget", "t1_gof.sync_budget"} <= set(failed)
    assert all(name.split(".")[1].startswith(BUDGET_CELLS) for name in failed), failed


def test_the_correct_engine_passes_both_budgets_and_the_evidence_lists_them(tmp_path):
    code, bundle = _run([str(BUDGET), "--output", str(tmp_path / "out")])
    assert code == 0, (bundle / "summary.json").read_text()
    manifest = json.loads((bundle / "manifest.json").read_text())
    cells = {name: {"max_num_batched_tokens": 65536} for name in DEFAULT_CELLS}
    assert manifest["settings"] == {**cells, **{name: {"max_num_batched_tokens": 256} for name in BUDGET_CELLS}}
    line = (
        "settings covered (adapter options by group, the same checks in each): nospec, sync: "
        "max_num_batched_tokens 65536; nospec_budget, sync_budget: max_num_batched_tokens 256"
    )
    report = (bundle / "report.md").read_text()
    assert f"- {line}\n" in report.split("## Criteria")[0]  # on the first screen
    assert line in (bundle / "report.html").read_text()
    verified = CliRunner().invoke(main, ["verify", str(bundle)])
    assert verified.exit_code == 0, verified.output  # the settings line re-renders byte for byte


def test_specval_mutate_states_no_single_exact_t1_law_for_a_setting_mutant():
    """Its law at t1 depends on the group's token budget (exact in one, not in the other), so the
    kill table leaves the exact TV out instead of printing the default setting's 0."""
    from specval.distribution.mutate import plain_law, t1_law

    protocol, logits = load_protocol(BUDGET), np.linspace(0.0, 3.0, 16)
    assert plain_law(MUTANT, logits, protocol) is None and t1_law(MUTANT, logits, logits, protocol) is None
    assert plain_law("temperature_twice", logits, protocol) is not None  # one law in every setting
