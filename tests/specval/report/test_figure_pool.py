"""Figure pool: figures rendered by worker processes have the bytes of the serial rendering; the
workers see no CUDA device and ignore SIGINT; they are gone after a run, also an interrupted one;
a lost worker falls back to serial rendering instead of hanging.

Each test starts one pool (a spawned interpreter importing matplotlib: seconds on a 2-core CI
machine), so the pool tests are few and use one worker unless the test needs two."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from specval import bundle as bundles
from specval import report
from specval.distribution import runner
from specval.execution import RunInterrupted
from specval.protocol import load_protocol, resolve
from specval.report.figure_pool import SUMMARY_FIGURES, FigurePool, predicted_criteria, worker_count
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import FakeSUT, KilledFakeSUT

KEPT = Path(__file__).resolve().parents[3] / "reports" / "t2_fp32-20261201T013950Z"  # 3 groups x 5,000 samples


@pytest.fixture(scope="module")
def pooled_bundle(tmp_path_factory) -> Path:
    """A fake-SUT ci run whose figures one worker rendered (early observed-vs-expected figures included)."""
    root = tmp_path_factory.mktemp("pooled")
    path, summary = runner.run(
        write_protocol(root, fake_protocol_dict()),
        "ci",
        root / "results",
        sut_factory=FakeSUT,
        progress=False,
        figure_workers=1,
    )
    assert summary["verdict"] == "PASS", summary["reason"]
    assert multiprocessing.active_children() == []  # the worker is shut down with the run
    return path


def _inputs(path: Path) -> tuple[dict, object]:
    summary = bundles.read_json(path / bundles.SUMMARY_FILE)
    return summary, report.bundle_samples(path, bundles.read_json(path / bundles.MANIFEST_FILE))


def test_pooled_run_reports_the_bytes_serial_rendering_gives_and_splits_its_analysis(pooled_bundle):
    assert runner.verify(pooled_bundle, figure_workers=0) == []  # verify re-renders serially, byte for byte
    summary, _ = _inputs(pooled_bundle)
    protocol, _ = runner.load_bundle_protocol(pooled_bundle)
    observed = [name for name, _ in report.observed_criteria(summary)]
    assert observed and set(observed) <= {name for name, _, _ in predicted_criteria(protocol)}
    manifest = json.loads((pooled_bundle / bundles.MANIFEST_FILE).read_text())
    steps = manifest["analysis_steps"]
    assert set(steps) == set(runner.ANALYSIS_STEPS) - {"stage2_load_s", "stage2_reference_s"}
    assert all(seconds >= 0 for seconds in steps.values())
    # the steps are disjoint parts of analysis_s + report_s (bookkeeping between them is the rest)
    assert sum(steps.values()) <= manifest["analysis_s"] + manifest["report_s"]


def test_pool_renders_a_kept_bundle_as_its_report_and_workers_never_see_cuda(capsys):
    summary, samples = _inputs(KEPT)
    protocol, _ = runner.load_bundle_protocol(KEPT)
    serial = report.figures(KEPT, summary, samples)
    with FigurePool(2) as pool:
        facts = pool.worker_facts()
        pool.submit_observed(KEPT, protocol, samples)
        pooled = pool.figures(KEPT, summary, samples)
        files = report.render_files(KEPT, render_figures=pool.figures)
    assert all(f["cuda_visible_devices"] == "" and not f["torch_loaded"] and f["sigint_ignored"] for f in facts)
    assert list(pooled) == list(serial) and pooled == serial
    assert files == {name: (KEPT / name).read_bytes() for name in bundles.REPORT_FILES}
    assert multiprocessing.active_children() == []
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("early", [False, True], ids=["late", "early"])
def test_a_lost_worker_falls_back_to_serial_rendering_with_one_line(pooled_bundle, capsys, early):
    summary, samples = _inputs(pooled_bundle)
    with FigurePool(1) as pool:
        (facts,) = pool.worker_facts()
        os.kill(facts["pid"], signal.SIGKILL)
        if early:  # the early hand-over meets the broken pool first: it must not raise
            protocol, _ = runner.load_bundle_protocol(pooled_bundle)
            # Wait until the executor has noticed the loss: the probe fails, or (when the executor's
            # manager thread got there first, as on a loaded machine) submitting it already raises.
            try:
                probe = pool._executor.submit(os.getpid)  # noqa: SLF001
                assert probe.exception(timeout=60) is not None
            except BrokenProcessPool:
                pass
            pool.submit_observed(pooled_bundle, protocol, samples)
        figures = pool.figures(pooled_bundle, summary, samples)
    assert figures == report.figures(pooled_bundle, summary, samples)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a figure worker was lost" in err and "rendered in this process" in err
    assert multiprocessing.active_children() == []


def test_an_interrupted_run_shuts_its_workers_down(tmp_path):
    with pytest.raises(RunInterrupted):
        runner.run(
            write_protocol(tmp_path, fake_protocol_dict()),
            "ci",
            tmp_path / "results",
            sut_factory=KilledFakeSUT,
            progress=False,
            figure_workers=1,
        )
    assert multiprocessing.active_children() == []


def test_worker_count_leaves_a_core_to_the_run_and_is_serial_for_small_runs_or_one_core(tmp_path):
    small = resolve(load_protocol(write_protocol(tmp_path, fake_protocol_dict())), "ci")  # 2 x 800 samples
    large = resolve(
        load_protocol(write_protocol(tmp_path, fake_protocol_dict(samples_per_group=60_000), name="large.yaml")), None
    )  # 2 x 60,000 samples
    figures = len(predicted_criteria(large)) + SUMMARY_FIGURES
    assert worker_count(small, cpus=64) == 0
    assert worker_count(large, cpus=1) == 0
    assert worker_count(large, cpus=2) == 1
    assert worker_count(large, cpus=64) == figures
