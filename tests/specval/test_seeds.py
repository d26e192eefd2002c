"""Seed ledger: consecutive disjoint ranges per run; any overlap is refused before sampling."""

from __future__ import annotations

import pytest

from specval import seeds
from specval.seeds import SeedOverlapError, SeedRange


def test_runs_get_consecutive_disjoint_ranges(tmp_path):
    first = seeds.allocate([], "p", "run1", ["a", "b"], 100, base=1000)
    assert [(r.start, r.stop) for r in first] == [(1000, 1100), (1100, 1200)]
    seeds.claim(tmp_path, first)
    second = seeds.allocate(seeds.read_ledger(tmp_path), "p", "run2", ["a", "b"], 50, base=1000)
    assert [(r.start, r.stop) for r in second] == [(1200, 1250), (1250, 1300)]
    seeds.claim(tmp_path, second)
    other = seeds.allocate(seeds.read_ledger(tmp_path), "q", "run3", ["a"], 10, base=0)
    assert (other[0].start, other[0].stop) == (0, 10)  # ledgers are per protocol
    assert len(seeds.read_ledger(tmp_path)) == 4


def test_overlap_with_an_earlier_run_is_refused_and_nothing_is_recorded(tmp_path):
    seeds.claim(tmp_path, seeds.allocate([], "p", "run1", ["a", "b"], 100, base=0))
    before = (tmp_path / "ledger.json").read_text()
    forced = seeds.allocate(seeds.read_ledger(tmp_path), "p", "run2", ["a"], 100, base=0, offset=150)
    with pytest.raises(SeedOverlapError, match=r"\[150, 250\).*\[100, 200\).*'b'.*'run1'"):
        seeds.claim(tmp_path, forced)
    assert (tmp_path / "ledger.json").read_text() == before


def test_overlap_between_groups_of_one_run_is_refused():
    ranges = [SeedRange("p", "r", "a", 0, 10), SeedRange("p", "r", "b", 5, 15)]
    with pytest.raises(SeedOverlapError, match="groups 'a' and 'b'"):
        seeds.check_disjoint([], ranges)


def test_claim_is_idempotent_for_the_same_run(tmp_path):
    ranges = seeds.allocate([], "p", "run1", ["a"], 10, base=0)
    seeds.claim(tmp_path, ranges)
    seeds.claim(tmp_path, ranges)  # a resumed run re-claims its own ranges
    assert seeds.read_ledger(tmp_path) == ranges
