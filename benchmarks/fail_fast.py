"""Fail fast: samples and seconds to a verdict for every planted bug of the kill table, with and
without sequential looks.

For each mutant of the protocol's adapter (`specval mutate`'s list: `Capabilities.mutants`, then
the harness's seed collision), the protocol runs twice as `specval mutate` runs it
(`mutate.run_protocol`: a copy with `sut.options.mutant` set, run exploratory, each mutant and mode
with its own seed ledger, so both modes draw the same seeds): once as shipped, with its
`sequential` looks, and once with `sequential` removed (the fixed-size design). Samples are the
samples drawn over every stage (the manifest's `samples_drawn` and `stage2_samples_drawn`),
seconds the process wall of the run (`wall_s`: setup, collection, analysis, report).

    OMP_NUM_THREADS=1 python -m benchmarks.fail_fast --protocol protocols/t2_fp32.yaml \\
        --profile smoke --output results/fail_fast [--mutant residual_from_p ...]

Prints one markdown row per mutant as it finishes, then writes `<output>/fail_fast.json`;
`--table` reprints the table of such a file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from specval.distribution import mutate
from specval.kinds import read_protocol_file

FIXED, LOOKS = "fixed", "looks"
HEADER = (
    "| mutant | verdict (fixed) | samples (fixed) | s (fixed) | verdict (looks) | stopped at look | "
    "samples (looks) | s (looks) | samples saved |"
)


def _without_looks(protocol_file: Path, output: Path) -> Path:
    """A copy of the protocol without its `sequential` block (same name: the same seeds)."""
    raw = yaml.safe_load(protocol_file.read_text())
    if "sequential" not in raw:
        raise SystemExit(f"{protocol_file}: has no `sequential` block to compare against")
    raw.pop("sequential")
    path = output / FIXED / protocol_file.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _look(cell: dict, base: Path) -> str:
    """The look the run stopped at ("1 of 4"), from its summary (its bundle is relative to `base`);
    "-" without a bundle."""
    if not cell.get("bundle"):
        return "-"
    summary = json.loads((base / cell["bundle"] / "summary.json").read_text())
    block = summary.get("sequential")
    return f"{block['stopped_at_look']} of {block['num_looks']}" if block else "-"


def _samples(cell: dict, base: Path) -> int:
    """Samples drawn over both stages (the manifest's `samples_drawn` counts stage 1 only); 0
    without a bundle (refused before sampling)."""
    if not cell.get("bundle"):
        return 0
    manifest = json.loads((base / cell["bundle"] / "manifest.json").read_text())
    return int(manifest["samples_drawn"]) + int(manifest.get("stage2_samples_drawn") or 0)


def _row(name: str, fixed: dict, looks: dict, bases: dict[str, Path]) -> str:
    drawn = {FIXED: _samples(fixed, bases[FIXED]), LOOKS: _samples(looks, bases[LOOKS])}
    saved = f"{1 - drawn[LOOKS] / drawn[FIXED]:.0%}" if drawn[FIXED] else "-"
    cells = [
        name,
        fixed["verdict"],
        drawn[FIXED],
        _seconds(fixed),
        looks["verdict"],
        _look(looks, bases[LOOKS]),
        drawn[LOOKS],
        _seconds(looks),
        saved,
    ]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _seconds(cell: dict) -> str:
    return f"{cell['seconds']:.1f}" if cell.get("seconds") is not None else "0"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", type=Path, default=Path("protocols/t2_fp32.yaml"))
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--output", type=Path, default=Path("results/fail_fast"))
    parser.add_argument("--mutant", action="append", default=[], help="this mutant only (repeatable)")
    parser.add_argument("--table", action="store_true", help="reprint the table of <output>/fail_fast.json")
    args = parser.parse_args(argv)
    output = args.output.resolve()
    if args.table:
        _reprint(output)
        return
    output.mkdir(parents=True, exist_ok=True)
    files = {LOOKS: args.protocol.resolve(), FIXED: _without_looks(args.protocol.resolve(), output)}
    protocol = read_protocol_file(files[LOOKS]).load()
    rows = []
    print(HEADER + "\n|" + " --- |" * (HEADER.count("|") - 1), flush=True)
    for mutant in mutate.adapter_mutants(protocol.sut.adapter, tuple(args.mutant)):
        cells = {
            mode: mutate.run_protocol(mutant, file, args.profile, output / mode / mutant.name, None)
            for mode, file in files.items()
        }
        rows.append({"mutant": mutant.name, **cells})
        print(_row(mutant.name, cells[FIXED], cells[LOOKS], {mode: output / mode for mode in files}), flush=True)
    (output / "fail_fast.json").write_text(
        json.dumps(
            {"protocol": str(args.protocol), "profile": args.profile, "command": " ".join(sys.argv), "rows": rows},
            indent=2,
        )
    )


def _reprint(output: Path) -> None:
    rows = json.loads((output / "fail_fast.json").read_text())["rows"]
    print(HEADER + "\n|" + " --- |" * (HEADER.count("|") - 1))
    for row in rows:
        print(_row(row["mutant"], row[FIXED], row[LOOKS], {FIXED: output / FIXED, LOOKS: output / LOOKS}))


if __name__ == "__main__":
    main()
