"""What the Python API's worker costs (specval.worker): the seconds `specval.run` takes beyond the
same run in the caller's process (`specval.api.run_protocol_file`, what `specval.run` did before it
was supervised).

    PYTHONPATH=. python -m benchmarks.api_worker_cost [--repeats 5]

Rows (wall seconds, median of the repeats, the three ways interleaved; one warm-up of each first):
- a run refused in the worker (an unfrozen protocol: ProtocolError, answered and raised again),
  which is the worker's start-up alone: a fresh Python importing the harness, or a fork;
- a run of the fake SUT's small protocol to a sealed bundle.
Ways: `fresh` (the adapter given by name: a fresh Python), `fork` (the adapter given as a lambda: a
forked child), `in-process` (no worker).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import specval
from specval import api
from specval.kinds import read_protocol_file
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import FakeSUT
from tests.fixtures.small_bundles import SMALL

NAME = "tests.fixtures.fake_sut:FakeSUT"


def _in_process(protocol: Path, output: Path) -> None:
    api.run_protocol_file(read_protocol_file(protocol), protocol, "ci", output, sut_factory=FakeSUT)


def _ways(protocol: Path) -> dict[str, Callable[[Path], object]]:
    return {
        "fresh": lambda out: specval.run(protocol, profile="ci", sut=NAME, output=out),
        "fork": lambda out: specval.run(protocol, profile="ci", sut=lambda spec, k: FakeSUT(spec, k), output=out),
        "in-process": lambda out: _in_process(protocol, out),
    }


def _seconds(call: Callable[[Path], object], root: Path, refused: bool) -> float:
    out = Path(tempfile.mkdtemp(dir=root))
    start = time.perf_counter()
    try:
        call(out)
    except specval.ProtocolError:
        if not refused:
            raise
    else:
        if refused:
            raise SystemExit("expected a refusal")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        unfrozen = write_protocol(root, fake_protocol_dict(**SMALL, seed_base=7), "unfrozen.yaml", frozen=False)
        cases = {
            "refused in the worker": (unfrozen, True),
            "small run to a sealed bundle": (write_protocol(root, fake_protocol_dict(**SMALL)), False),
        }
        for case, (protocol, refused) in cases.items():
            ways = _ways(protocol)
            times: dict[str, list[float]] = {way: [] for way in ways}
            for call in ways.values():
                _seconds(call, root, refused)  # warm-up: this process's imports
            for _ in range(repeats):
                for way, call in ways.items():
                    times[way].append(_seconds(call, root, refused))
            medians = {way: statistics.median(values) for way, values in times.items()}
            cells = ", ".join(f"{way} {seconds:.2f} s" for way, seconds in medians.items())
            print(f"{case}: {cells} (median of {repeats})")


if __name__ == "__main__":
    main()
