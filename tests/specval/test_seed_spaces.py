"""Exploratory runs never see confirmatory seeds (specval/seeds.py, docs/harness.md section 4): an
exploratory run draws from [seed_base + 2**31, 2**32 - 16), a confirmatory run from seed_base on as
before, for every kind that claims seeds (distribution, sequence, quality: `lifecycle.start_bundle`).

Everything here is deterministic (seed ranges; the end-to-end runs' PASS is that of the fake
protocol's ci profile on fixed seeds, tests/specval/test_api.py, false-fail rate <= 0.02 over seed
choices).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import specval
from specval import bundle as bundles
from specval import lifecycle, seeds
from specval.distribution import stages
from specval.kinds import read_protocol_file
from specval.seeds import EXPLORATORY_OFFSET, PROBE_SEED_START, SeedOverlapError, SeedRange
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

PROTOCOLS = Path(__file__).resolve().parents[2] / "protocols"


def _spans(ranges) -> list[tuple[int, int]]:
    return [(r.start, r.stop) for r in ranges]


def _disjoint(a, b) -> bool:
    return all(x.stop <= y.start or y.stop <= x.start for x in a for y in b)


# ---------------------------------------------------------------- the ledger


def test_each_space_allocates_after_its_own_ranges_only(tmp_path):
    explore = seeds.allocate([], "p", "e1", ["a", "b"], 100, base=1000, exploratory=True)
    assert _spans(explore) == [
        (1000 + EXPLORATORY_OFFSET, 1100 + EXPLORATORY_OFFSET),
        (1100 + EXPLORATORY_OFFSET, 1200 + EXPLORATORY_OFFSET),
    ]
    seeds.claim(tmp_path, explore)
    confirm = seeds.allocate(seeds.read_ledger(tmp_path), "p", "c1", ["a", "b"], 100, base=1000)
    assert _spans(confirm) == [(1000, 1100), (1100, 1200)]  # as in a fresh root: exploratory ranges are not its
    seeds.claim(tmp_path, confirm)
    again = seeds.allocate(seeds.read_ledger(tmp_path), "p", "e2", ["a"], 50, base=1000, exploratory=True)
    assert _spans(again) == [(1200 + EXPLORATORY_OFFSET, 1250 + EXPLORATORY_OFFSET)]
    assert [seeds.space_of(r.start, 1000) for r in explore + confirm] == ["exploratory"] * 2 + ["confirmatory"] * 2
    assert seeds.space_start(1000, False) == 1000 and seeds.space_start(1000, True) == 1000 + EXPLORATORY_OFFSET


def test_a_later_stage_of_an_exploratory_run_stays_exploratory(tmp_path):
    seeds.claim(tmp_path, seeds.allocate([], "p", "bundle-1", ["a"], 100, base=0, exploratory=True))
    seeds.claim(tmp_path, seeds.allocate([], "p", "bundle-2", ["a"], 100, base=0, offset=500))  # confirmatory
    ledger = seeds.read_ledger(tmp_path)
    stage2 = seeds.allocate(ledger, "p", "bundle-1" + stages.STAGE2_RUN_SUFFIX, ["a"], 100, base=0)
    assert _spans(stage2) == [(EXPLORATORY_OFFSET + 100, EXPLORATORY_OFFSET + 200)]
    confirmed = seeds.allocate(ledger, "p", "bundle-2" + stages.STAGE2_RUN_SUFFIX, ["a"], 100, base=0)
    assert _spans(confirmed) == [(600, 700)]
    for suffix in (stages.STAGE2_RUN_SUFFIX, lifecycle.STAGE2_RUN_SUFFIX):  # the stage naming the ledger relies on
        assert suffix.startswith(seeds.STAGE_SEPARATOR)


def test_a_run_that_does_not_fit_its_space_is_refused_and_an_offset_is_taken_as_given():
    held = [SeedRange("p", "old", "a", 0, EXPLORATORY_OFFSET - 10)]
    with pytest.raises(SeedOverlapError, match=r"do not fit the confirmatory seed space \[0, 2147483648\)"):
        seeds.allocate(held, "p", "new", ["a"], 100, base=0)
    with pytest.raises(SeedOverlapError, match="do not fit the exploratory seed space"):
        seeds.allocate([], "p", "new", ["a"], 100, base=PROBE_SEED_START - EXPLORATORY_OFFSET - 50, exploratory=True)
    assert _spans(seeds.allocate(held, "p", "new", ["a"], 10, base=0, offset=7, exploratory=True)) == [(7, 17)]


# ---------------------------------------------------------------- every kind's claim


@pytest.mark.parametrize(
    "name", ["t2_fp32.yaml", "t3_fp32.yaml", "seq_fp32.yaml", "quality_arith.yaml"], ids=lambda n: n.split(".")[0]
)
def test_every_kind_claims_exploratory_seeds_apart_from_confirmatory_ones(tmp_path, name):
    """`lifecycle.start_bundle`, the claim of the distribution, sequence and quality runners, in
    fresh output roots: a confirmatory run from seed_base, an exploratory one from seed_base +
    2**31; an exploratory run first in the same root leaves the confirmatory seeds as they were."""
    file = PROTOCOLS / name
    protocol = read_protocol_file(file).load()

    def start(output: Path, exploratory: bool):
        registration = "not frozen" if exploratory else "frozen"
        path, ranges = lifecycle.start_bundle(
            file, protocol, protocol, output, ["a", "b"], 1000, None, registration, exploratory
        )
        plan = bundles.RunPlan.from_dict(bundles.read_json(path / bundles.RUN_FILE))
        assert plan.exploratory is exploratory and plan.ranges == tuple((r.group, r.start, r.stop) for r in ranges)
        return ranges

    confirmatory = start(tmp_path / "frozen", False)
    exploratory = start(tmp_path / "scratch", True)
    assert confirmatory[0].start == protocol.seed_base
    assert exploratory[0].start == protocol.seed_base + EXPLORATORY_OFFSET
    assert _disjoint(confirmatory, exploratory)
    start(tmp_path / "both", True)
    assert _spans(start(tmp_path / "both", False)) == _spans(confirmatory)


# ---------------------------------------------------------------- end to end


def _seeds_of(bundle: Path) -> set[int]:
    return {int(s) for f in sorted((bundle / "samples").glob("*.parquet")) for s in pd.read_parquet(f)["seed"]}


def test_an_exploratory_and_a_frozen_run_in_fresh_folders_draw_disjoint_seeds(tmp_path):
    """The same frozen protocol run as a CI gate would (confirmatory) and as a user trying it would
    (`exploratory=True`), each in a fresh output folder: no seed in common; both verify, and the
    manifest names each run's seed space."""
    file = write_protocol(tmp_path, fake_protocol_dict())
    frozen = specval.run(file, profile="ci", output=tmp_path / "gate")
    tried = specval.run(file, profile="ci", output=tmp_path / "scratch", exploratory=True)
    assert (frozen.verdict, frozen.exploratory, tried.exploratory) == ("PASS", False, True)
    drawn_frozen, drawn_tried = _seeds_of(frozen.bundle), _seeds_of(tried.bundle)
    assert len(drawn_frozen) == len(drawn_tried) == 2 * 800 and not drawn_frozen & drawn_tried
    assert min(drawn_frozen) == 0 and min(drawn_tried) == EXPLORATORY_OFFSET
    for result, space in ((frozen, "confirmatory"), (tried, "exploratory")):
        assert bundles.read_json(result.bundle / bundles.MANIFEST_FILE)["seed_space"] == space
        assert specval.verify(result.bundle).ok
