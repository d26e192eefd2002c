"""What supervision costs (specval.supervisor): the seconds a supervised command takes beyond the
same command run in one process, and the time each guarded adapter call spends on the channel.

    PYTHONPATH=. python -m benchmarks.supervisor_cost [--repeats 5]

Rows (wall seconds, median of the repeats; supervised = `python -m specval ...`, one process =
`python -m specval.cli ...`, the command line without a supervisor):
- `run` refused at once (a protocol file that does not exist: exit 2 in the worker), which is
  start-up alone: the supervisor's Python, its imports and the worker's start;
- `run` of the fake SUT's small protocol to a sealed PASS, which adds the seal check;
- the supervisor's own parts, each in a fresh Python: its start (the interpreter and its imports,
  before it starts the worker) and, at the end, the seal check of the run's bundle;
- a guarded adapter call (`GuardedSUT`, a method returning at once) with and without a channel
  directory: the two pwrites of `channel.adapter_call`.
The adapter runs wholly in the worker, so no sample crosses a process boundary: there is no
per-batch transfer to measure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specval import channel
from specval.preflight import GuardedSUT
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.small_bundles import SMALL

CALLS = 20_000  # guarded calls timed per repeat
SUPERVISED = ("-m", "specval")
ONE_PROCESS = ("-m", "specval.cli")
SUPERVISOR_START = "from specval import channel, supervisor"  # what the supervisor imports before the worker
SEAL_CHECK = (
    "from pathlib import Path; from specval import supervisor; "
    "assert supervisor.seal_problem(Path({bundle!r}), 0) is None"
)


def _wall(cwd: Path, entry: tuple[str, ...], args: list[str], expected: int) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *entry, *args], cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != expected:
        raise SystemExit(f"{entry} {args}: exit {done.returncode}, expected {expected}\n{done.stderr}")
    return elapsed


class _Quick:
    def ping(self) -> int:
        return 0


def _call_us(channel_dir: str | None) -> float:
    if channel_dir is None:
        os.environ.pop(channel.CHANNEL_ENV, None)
    else:
        os.environ[channel.CHANNEL_ENV] = channel_dir
    sut = GuardedSUT(_Quick())  # type: ignore[arg-type]
    ping = sut.ping
    start = time.perf_counter()
    for _ in range(CALLS):
        ping()
    os.environ.pop(channel.CHANNEL_ENV, None)
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    rows = []
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        protocol = write_protocol(root, fake_protocol_dict(**SMALL))
        cases = [
            ("run, refused at once (exit 2)", ["run", str(root / "missing.yaml")], 2),
            ("run to a sealed PASS (fake SUT, 800 samples)", ["run", str(protocol), "--profile", "ci", "--quiet"], 0),
        ]
        for label, args, expected in cases:
            one, sup = [], []
            for _ in range(repeats):  # interleaved, so that a change of the machine's load hits both
                one.append(_wall(root, ONE_PROCESS, args, expected))
                sup.append(_wall(root, SUPERVISED, args, expected))
            rows.append((label, statistics.median(one), statistics.median(sup)))
        bundle = next((root / "results").glob("*/SHA256SUMS"))  # a sealed bundle of the runs above
        for label, code in (
            ("the supervisor's own start: Python + its imports", SUPERVISOR_START),
            ("+ the seal check of a bundle, with its imports", SEAL_CHECK.format(bundle=str(bundle.parent))),
        ):
            walls = [_wall(root, ("-c", code), [], 0) for _ in range(repeats)]
            rows.append((label, None, statistics.median(walls)))
        plain = statistics.median(_call_us(None) for _ in range(repeats))
        recorded = statistics.median(_call_us(name) for _ in range(repeats))
    print("| command | one process (s) | supervised (s) | extra (s) |\n| --- | ---: | ---: | ---: |")
    for label, one_s, sup_s in rows:
        if one_s is None:
            print(f"| {label} | - | {sup_s:.2f} | - |")
        else:
            print(f"| {label} | {one_s:.2f} | {sup_s:.2f} | {sup_s - one_s:+.2f} |")
    print(
        f"\nguarded adapter call: {plain:.2f} us without a channel, {recorded:.2f} us with one "
        f"({recorded - plain:+.2f} us a call; median of {repeats} x {CALLS} calls)"
    )


if __name__ == "__main__":
    main()
