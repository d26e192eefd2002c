"""A/A calibration of a shipped sequence protocol's WHOLE family: false-FAIL rate on a null model.

Each replicate draws every group of the protocol (seq_fp32 at its smoke profile by default: 7
groups of 200 sequences of 64 tokens, K = 3, the pit, serial, independence, reproducibility and
source tests) from `tests/fixtures/sequence_null.py`, a faithful cheaper model of a correct run
(its docstring says what it keeps and what it replaces: the real protocol, layout, round structure
of exact speculative sampling at acceptance ~0.8 and reference parts; a Markov chain in place of the
model), and evaluates it with the real `specval.sequence.verdict.evaluate`: every p-valued criterion
(50 for seq_fp32, one Holm family per role), the PIT uniforms and Monte Carlo nulls from the
criterion streams under a fresh seed range per group and replicate, the early-rejection rule, the
run verdict; only the printed MDEs are skipped (`sequence_null.mdes_not_printed`: no verdict reads
them, and they cost a quarter of the time). Every replicate is appended to `--output` (JSON lines)
as it ends, so a long run can be stopped and continued (`--first`) and the table printed from the
file alone (`--report-only`). Prints the family FAIL count, its rate and Clopper-Pearson 95% interval next to alpha,
then per criterion kind and per criterion the raw rejections at the family's first Holm step
(p <= alpha / m) and at p <= alpha (each p-value's own size at alpha, with its interval), and the
Holm FAILs.

    nice -n 10 python -m benchmarks.sequence_calibration --replicates 2000 --workers 2 --output calib.jsonl

With looks (`--looks 0.5,1.0 [--spending pocock]`, or a protocol that has them) each replicate is
walked as a run walks it (`sequence_null.evaluate_replicate`: look k evaluates every group's first
b_k batches at its share of alpha, stopping at the first FAIL); `--sequences N` sets the sequences
per group (a smoke profile of 4 batches per group is too small for a look at half of it). The table
then gives the family FAIL count with its interval, the FAILs by look, and per criterion the
replicates in which it FAILed at the look that stopped the run (p-values of looks at other levels
are not pooled).

    nice -n 10 python -m benchmarks.sequence_calibration --looks 0.5,1.0 --sequences 400 --output looks.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from specval.protocol import ProtocolError
from specval.protocol.schema import SequentialSpec
from specval.sequence import verdict
from specval.sequence.protocol import SequenceProtocol, check_layout, check_looks, load_sequence_protocol, resolve
from specval.stats.rates import rate_ci
from specval.stats.sequential import POCOCK, SPENDINGS
from tests.fixtures import sequence_null

DEFAULT_PROTOCOL = "protocols/seq_fp32.yaml"
CHAIN_SEED = 20261207  # the null model's chains and draws: (CHAIN_SEED, replicate)
INTERVAL = 0.05  # two-sided Clopper-Pearson 95%
PROGRESS_EVERY = 100
RUN = "__run__"


@dataclasses.dataclass(frozen=True)
class Design:
    """What one calibration evaluates: the protocol file and profile, and what the options change
    (`looks`: fractions, empty for the protocol's own; `sequences`: None for the profile's)."""

    path: str
    profile: str | None
    looks: tuple[float, ...] = ()
    spending: str = POCOCK
    sequences: int | None = None

    def protocol(self) -> SequenceProtocol:
        """The resolved protocol with the options applied, its layout and looks checked as a
        protocol file's are (ProtocolError naming the key and the value)."""
        protocol = resolve(load_sequence_protocol(self.path), self.profile)
        if self.sequences is not None:
            protocol = dataclasses.replace(protocol, sequences_per_group=self.sequences, file_hash=protocol.hash)
        if self.looks:
            protocol = dataclasses.replace(
                protocol, sequential=SequentialSpec(self.looks, self.spending), file_hash=protocol.hash
            )
        check_layout(protocol, self.path)
        check_looks(protocol, self.path)
        return protocol


def replicate(job: tuple[Design, int]) -> dict:
    """{criterion: p-value or None, ...} of one null replicate (with looks: of the look it stopped
    at), the Holm verdicts under "verdicts", the run verdict under RUN and, with looks, the look it
    stopped at under "stopped_at_look"."""
    design, index = job
    with sequence_null.mdes_not_printed():
        decided = sequence_null.evaluate_replicate(design.protocol(), index, CHAIN_SEED)
    tests = decided["tests"]
    looked = {"stopped_at_look": decided["sequential"]["stopped_at_look"]} if "sequential" in decided else {}
    return {
        "replicate": index,
        "p": {name: t["p_value"] for name, t in tests.items() if t["p_value"] is not None},
        "verdicts": {name: t["verdict"] for name, t in tests.items()},
        RUN: decided["verdict"],
        **looked,
    }


def _line(label: str, hits: int, total: int) -> str:
    low, high = rate_ci(hits, total, INTERVAL)
    return f"{label} {hits} ({hits / total:.4f}, CP 95% [{low:.4f}, {high:.4f}])"


def report(protocol: SequenceProtocol, results: list[dict], seconds: float) -> Iterable[str]:
    """The table of the module docstring (`looks_report` for a protocol with looks)."""
    if protocol.sequential is not None:
        yield from looks_report(protocol, results, seconds)
        return
    sizes, total = verdict.family_sizes(protocol), len(results)
    first_step = {role: protocol.alpha / m for role, m in sizes.items()}
    roles = {name: role for name, role, _ in verdict.planned_criteria(protocol)}
    names = sorted(results[0]["p"])
    fails = sum(r[RUN] == verdict.FAIL for r in results)
    yield (
        f"{protocol.name} ({protocol.profile}): {len(protocol.groups)} groups x {protocol.sequences_per_group} "
        f"sequences x {protocol.sequence_length} tokens, K = {protocol.num_speculative_tokens}; p-valued "
        f"criteria {len(names)}, families {sizes}, first Holm step {first_step}"
    )
    family = _line("family FAIL", fails, total)
    timing = f" in {seconds:.0f} s" if seconds else ""
    yield f"replicates {total}{timing}: {family} vs alpha {protocol.alpha}"
    yield ""
    yield "criterion | n | p <= first Holm step | p <= alpha | Holm FAIL"
    kinds = sorted({name.split(".")[0] for name in names})
    for label, members in [(f"{k} (all groups)", [n for n in names if n.split(".")[0] == k]) for k in kinds] + [
        (n, [n]) for n in names
    ]:
        checks = total * len(members)
        step = sum(r["p"][n] <= first_step[roles[n]] for r in results for n in members)
        at_alpha = sum(r["p"][n] <= protocol.alpha for r in results for n in members)
        holm = sum(r["verdicts"][n] == verdict.FAIL for r in results for n in members)
        yield f"{label} | {checks} | {step} | " + _line("", at_alpha, checks).strip() + f" | {holm}"


def looks_report(protocol: SequenceProtocol, results: list[dict], seconds: float) -> Iterable[str]:
    """The family FAIL count and its interval next to alpha, the FAILs by look, and per p-valued
    criterion kind and criterion the replicates it FAILed at the look that stopped the run."""
    sizes, total, spec = verdict.family_sizes(protocol), len(results), protocol.sequential
    fails = [r for r in results if r[RUN] == verdict.FAIL]
    yield (
        f"{protocol.name} ({protocol.profile}): {len(protocol.groups)} groups x {protocol.sequences_per_group} "
        f"sequences x {protocol.sequence_length} tokens, K = {protocol.num_speculative_tokens}; families {sizes}; "
        f"{spec.spending} looks at {list(spec.looks)} = batches {list(protocol.look_batches)} per group"
    )
    timing = f" in {seconds:.0f} s" if seconds else ""
    yield f"replicates {total}{timing}: {_line('family FAIL', len(fails), total)} vs alpha {protocol.alpha}"
    by_look = [sum(r["stopped_at_look"] == k for r in fails) for k in range(1, len(spec.looks) + 1)]
    yield "FAILs by look: " + ", ".join(f"look {k} {n}" for k, n in enumerate(by_look, start=1))
    yield ""
    yield "criterion | replicates | Holm FAIL at the stopping look"
    names = sorted(results[0]["p"])
    kinds = sorted({name.split(".")[0] for name in names})
    for label, members in [(f"{k} (all groups)", [n for n in names if n.split(".")[0] == k]) for k in kinds] + [
        (n, [n]) for n in names
    ]:
        holm = sum(r["verdicts"][n] == verdict.FAIL for r in results for n in members)
        yield f"{label} | {total * len(members)} | {holm}"


def run(args: argparse.Namespace) -> float:
    """Evaluate replicates --first .. --first + --replicates - 1, appending each to --output; seconds."""
    design = _design(args)
    jobs = [(design, i) for i in range(args.first, args.first + args.replicates)]
    start, done = time.perf_counter(), 0
    with ProcessPoolExecutor(args.workers) as pool, args.output.open("a") as sink:
        for result in pool.map(replicate, jobs, chunksize=2):
            sink.write(json.dumps(result) + "\n")
            sink.flush()
            done += 1
            if done % PROGRESS_EVERY == 0:
                print(f"{done} replicates, {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default=DEFAULT_PROTOCOL)
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--replicates", type=int, default=2000)
    parser.add_argument("--first", type=int, default=0, help="index of the first replicate (to continue a run)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--output", type=Path, required=True, help="JSON lines, one replicate each (appended)")
    parser.add_argument("--report-only", action="store_true", help="print the table of --output, run nothing")
    parser.add_argument("--looks", default="", help="fractions of the looks, e.g. 0.5,1.0 (default: the protocol's)")
    parser.add_argument("--spending", default=POCOCK, choices=SPENDINGS)
    parser.add_argument("--sequences", type=int, default=None, help="sequences per group (default: the profile's)")
    args = parser.parse_args()
    try:
        _design(args).protocol()
    except (ProtocolError, ValueError) as err:
        raise SystemExit(f"sequence_calibration: {err}") from None
    seconds = 0.0 if args.report_only else run(args)
    results = [json.loads(line) for line in args.output.read_text().splitlines() if line.strip()]
    if len({r["replicate"] for r in results}) != len(results):
        raise SystemExit(f"{args.output}: a replicate appears twice (continue with --first past the last one)")
    for line in report(_design(args).protocol(), results, seconds):
        print(line)


def _design(args: argparse.Namespace) -> Design:
    looks = tuple(float(f) for f in args.looks.split(",")) if args.looks else ()
    return Design(args.protocol, args.profile, looks, args.spending, args.sequences)


if __name__ == "__main__":
    main()
