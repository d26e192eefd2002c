"""The Monte Carlo budget (specval.budget): every shipped protocol is within it at every profile; a
protocol at alpha 1e-6 is refused by `run` (exit 2, one line, no ledger entry, no bundle) and by
`validate`, naming the cost, the budget and an alpha that fits; `plan` prints the cost; and the
planned caps are exactly the caps a run records. Deterministic: no statistic is asserted (the run
compared with the plan is checked for its recorded draw caps, whatever its verdict).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specval import budget, seeds
from specval.cli import main
from specval.kinds import read_protocol_file
from specval.protocol import resolve
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.small_bundles import SMALL

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(
    path
    for pattern in ("protocols/*.yaml", "protocols/suite/*.yaml", "examples/*/*.yaml")
    for path in ROOT.glob(pattern)
)
LOWEST_ALPHA = 1e-6  # specval.protocol.MIN_ALPHA: the lowest a protocol may state


def _profiles(protocol) -> list[str | None]:
    return [None, *(name for name, _ in getattr(protocol, "profiles", ()))]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_shipped_protocol_is_within_the_budget_at_every_profile(path):
    protocol = read_protocol_file(path).load()
    for profile in _profiles(protocol):
        cost = budget.check_profile(protocol, profile, path)
        assert cost.within_budget and all(0 < row.draws <= budget.MC_DRAW_BUDGET for row in cost.rows)


def test_the_shipped_protocols_have_monte_carlo_criteria_to_count():
    """The test above checks something: the distribution and sequence protocols plan draws."""
    counted = [path for path in SHIPPED if budget.planned_cost(read_protocol_file(path).load()).rows]
    assert len(counted) >= 10 and any("seq_" in path.name for path in counted), counted


@pytest.fixture
def at_lowest_alpha(tmp_path) -> Path:
    return write_protocol(tmp_path, fake_protocol_dict(**SMALL, alpha=LOWEST_ALPHA))


def test_a_protocol_at_alpha_1e_6_is_refused_before_the_ledger_is_touched(at_lowest_alpha, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(at_lowest_alpha), "--profile", "ci", "--output", str(out)])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    protocol = resolve(read_protocol_file(at_lowest_alpha).load(), "ci")
    cost, fits = budget.planned_cost(protocol), budget.smallest_alpha(protocol)
    top = cost.largest()
    assert line == (
        f"error: {at_lowest_alpha} (profile ci): the planned Monte Carlo cost of {top.criterion} is "
        f"{top.draws:,} null draws (rejected at level {top.level:.3g}), over the budget of "
        f"{budget.MC_DRAW_BUDGET:,} a criterion (specval.budget.MC_DRAW_BUDGET); alpha >= {fits:.2g} fits"
    )
    assert top.draws > budget.MC_DRAW_BUDGET and not seeds.read_ledger(out) and not out.exists()
    validated = CliRunner().invoke(main, ["validate", str(at_lowest_alpha)])
    assert validated.exit_code == 2 and "over the budget" in validated.output


def test_the_alpha_named_is_the_smallest_that_fits(at_lowest_alpha):
    protocol = read_protocol_file(at_lowest_alpha).load()
    fits = budget.smallest_alpha(protocol)
    assert budget.planned_cost(dataclasses.replace(protocol, alpha=fits)).within_budget
    assert not budget.planned_cost(dataclasses.replace(protocol, alpha=fits * 0.9)).within_budget


def test_plan_prints_the_cost_and_a_run_records_the_planned_caps(tmp_path):
    """The fake protocol's ci run (in this process): each p-valued criterion's recorded Monte Carlo
    cap is the one planned, and `plan` prints the largest and the run's sum."""
    path = write_protocol(tmp_path, fake_protocol_dict(**SMALL))
    planned = budget.planned_cost(resolve(read_protocol_file(path).load(), "ci"))
    shown = CliRunner().invoke(main, ["plan", "--protocol", str(path), "--profile", "ci"])
    assert shown.exit_code == 0 and planned.line() in shown.output.splitlines(), shown.output
    assert f"{planned.draws:,} for the run" in planned.line()
    out = tmp_path / "out"
    ran = CliRunner().invoke(main, ["run", str(path), "--profile", "ci", "--output", str(out), "--quiet"])
    assert ran.exit_code in (0, 1, 4), ran.output
    (bundle,) = out.glob("fake_t2-*")
    tests = json.loads((bundle / "summary.json").read_text())["tests"]
    recorded = {name: row["monte_carlo"]["max_draws"] for name, row in tests.items() if row.get("monte_carlo")}
    assert recorded == {row.criterion: row.draws for row in planned.rows}
