"""Collection: chunked checkpoints; a killed run resumes with no lost and no duplicated sample."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from specval.distribution import collect, runner
from specval.execution import RunInterrupted
from specval.seeds import SeedRange
from tests.fixtures.fake_sut import FakeSUT, KilledFakeSUT

PROBE_CALLS = 2  # the adapter probe samples once per group before any seed is claimed
# KilledFakeSUT dies after the probe and 5 batch calls (chunks of 2 batches: after 2 chunks + 1 batch)


def _samples(bundle: Path) -> pd.DataFrame:
    _, ranges = runner.load_bundle_protocol(bundle)
    return collect.load_samples(bundle, ranges)


def test_kill_and_resume_gives_the_samples_of_an_uninterrupted_run(tmp_path, fake_protocol_file):
    with pytest.raises(RunInterrupted) as interrupted:
        runner.run(fake_protocol_file, "ci", tmp_path / "a", sut_factory=KilledFakeSUT, progress=False)
    (killed,) = (tmp_path / "a").glob("fake_t2-*")
    assert interrupted.value.path == killed
    assert len(list((killed / "samples").glob("*.parquet"))) == 2
    assert not (killed / "summary.json").exists()
    resumed_sut = []

    def factory(spec, k):
        resumed_sut.append(FakeSUT(spec, k))
        return resumed_sut[0]

    path, summary = runner.run(None, None, tmp_path / "a", resume=killed, sut_factory=factory, progress=False)
    # 2 groups x 800 seeds in chunks of 400 = 4 chunks of 2 batches; 2 chunks survived the kill
    assert resumed_sut[0].num_sample_calls == PROBE_CALLS + 4
    fresh, _ = runner.run(fake_protocol_file, "ci", tmp_path / "b", sut_factory=FakeSUT, progress=False)
    pd.testing.assert_frame_equal(_samples(path), _samples(fresh))
    assert len(_samples(path)) == 1600 and summary["verdict"] == "PASS"
    assert runner.verify(path) == []


def test_load_samples_refuses_missing_and_duplicated_seeds(tmp_path, fake_protocol_file):
    path, _ = runner.run(fake_protocol_file, "ci", tmp_path, sut_factory=FakeSUT, progress=False)
    _, ranges = runner.load_bundle_protocol(path)
    chunks = sorted((path / "samples").glob("*.parquet"))
    duplicate = path / "samples" / "zz-duplicate.parquet"
    duplicate.write_bytes(chunks[0].read_bytes())
    with pytest.raises(ValueError, match="expected exactly seeds"):
        collect.load_samples(path, ranges)
    duplicate.unlink()
    chunks[-1].unlink()
    with pytest.raises(ValueError, match="expected exactly seeds"):
        collect.load_samples(path, ranges)


def test_load_samples_equals_the_sorted_concatenation_of_every_chunk(tmp_path, fake_protocol_file):
    path, _ = runner.run(fake_protocol_file, "ci", tmp_path, sut_factory=FakeSUT, progress=False)
    _, ranges = runner.load_bundle_protocol(path)
    chunks = [pd.read_parquet(f) for f in sorted((path / "samples").glob("*.parquet"))]
    expected = pd.concat(chunks, ignore_index=True).sort_values(["group", "seed"], kind="stable")
    pd.testing.assert_frame_equal(collect.load_samples(path, ranges), expected.reset_index(drop=True))
    with pytest.raises(ValueError, match="groups outside the plan"):
        collect.load_samples(path, [r for r in ranges if r.group != ranges[0].group])


def test_chunks_partition_each_range():
    ranges = [SeedRange("p", "r", "a", 10, 25), SeedRange("p", "r", "b", 25, 26)]
    chunks = collect.plan_chunks(ranges, 6)
    assert [(c.group, c.start, c.stop) for c in chunks] == [("a", 10, 16), ("a", 16, 22), ("a", 22, 25), ("b", 25, 26)]
