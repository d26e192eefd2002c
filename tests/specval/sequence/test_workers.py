"""The sequence kind's threads (`specval.sequence.workers`): results in order, errors raised, and a
whole family's verdict on several threads equal to the one-thread verdict, bit for bit.

Deterministic: the null model of tests/fixtures/sequence_null.py with a fixed seed.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from pathlib import Path

import pytest

from specval.sequence import verdict, workers
from specval.sequence.protocol import load_sequence_protocol, resolve
from tests.fixtures import sequence_null

REPO = Path(__file__).resolve().parents[3]


def test_results_come_back_in_the_order_of_the_jobs():
    jobs = (lambda n=n: n * n for n in range(40))
    assert workers.pipelined(jobs, 3) == [n * n for n in range(40)]
    assert workers.count(cpus=1) == 1 and workers.count(cpus=64) == workers.WORKERS_MAX


def test_an_error_in_a_job_is_raised_and_stops_the_jobs():
    produced = []

    def jobs():
        for number in range(50):
            produced.append(number)
            yield lambda number=number: 1 / (number - 2)  # job 2 divides by zero

    with pytest.raises(ZeroDivisionError):
        workers.pipelined(jobs(), 2)
    assert len(produced) < 50  # the iterable was not advanced past the error's discovery


def test_the_verdict_on_several_threads_is_the_one_thread_verdict(monkeypatch):
    shipped = resolve(load_sequence_protocol(REPO / "protocols" / "seq_fp32.yaml"), "smoke")
    protocol = dataclasses.replace(
        shipped,
        groups=tuple(g for g in shipped.groups if g.name in ("nospec", "async")),
        tests=tuple(t for t in shipped.tests if t.kind != "drafts"),  # the null model draws no drafts
        sequences_per_group=40,
        batch_size=10,
        sequence_length=16,
        alpha=0.3,  # so that some p-values run their nulls beyond the first draws
    )
    data, ranges = sequence_null.replicate_data(protocol, 0, 11), sequence_null.seed_ranges(protocol, 0)
    with sequence_null.mdes_not_printed():
        monkeypatch.setattr(workers, "count", lambda: 1)
        single = verdict.evaluate(protocol, data, ranges)
        monkeypatch.setattr(workers, "count", lambda: 4)
        threaded = verdict.evaluate(protocol, data, ranges)
    assert list(threaded["tests"]) == list(single["tests"])  # the planned order
    assert json.dumps(threaded, sort_keys=False) == json.dumps(single, sort_keys=False)
    assert sum(row.get("p_value") is not None for row in single["tests"].values()) >= 10


def test_an_interrupt_returns_without_waiting_for_the_running_jobs():
    """A Ctrl-C on the caller's thread (here: the iterable raises KeyboardInterrupt) leaves at once:
    the job still running (it waits on `release`, set only after the call returned) is abandoned on
    its daemon thread, and the queued ones never run."""
    release, started, ran = threading.Event(), threading.Event(), []
    safety = threading.Timer(60.0, release.set)  # never needed unless pipelined waits for the job
    safety.start()

    def blocking():
        started.set()
        release.wait()
        ran.append("blocking")

    def jobs():
        yield blocking
        started.wait()
        yield lambda: ran.append("queued")  # one worker, busy: this one waits in the queue
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            workers.pipelined(jobs(), 1)
        assert not release.is_set() and ran == []  # returned while the job still ran
    finally:
        release.set()
        safety.cancel()


def test_the_handoff_lowers_the_switch_interval_for_its_block_and_restores_it():
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        with workers.prompt_handoff():
            assert sys.getswitchinterval() == pytest.approx(workers.HANDOFF_INTERVAL_S)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        sys.setswitchinterval(1e-5)  # never raised above what it was
        with pytest.raises(RuntimeError), workers.prompt_handoff():
            assert sys.getswitchinterval() == pytest.approx(1e-5)
            raise RuntimeError("restored on the way out too")
        assert sys.getswitchinterval() == pytest.approx(1e-5)
    finally:
        sys.setswitchinterval(before)
