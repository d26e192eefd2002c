"""Warp-stall samples of an Nsight Compute source export, summed by source line.

Input: `ncu --import REPORT.ncu-rep --page source --csv --print-source cuda,sass > lines.csv`
(the kernel profiled with `--set full --import-source yes`, e.g. through
benchmarks/profile_call.py). Prints the source lines with the most stall samples, their share
of all samples, the warp instructions they executed and their three main stall reasons.

Usage: python3 -m benchmarks.ncu_source_lines lines.csv [TOP]
"""

from __future__ import annotations

import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def source_lines(path: str) -> list[tuple[int, str, str, str, str, list]]:
    """(samples, file, line, source, instructions, top stalls) of every source line."""
    rows, file, header = [], None, None
    with open(path, newline="") as f:
        for record in csv.reader(f):
            if not record:
                continue
            if record[0] == "File Path":
                file = record[1].rsplit("/", 1)[-1]
            elif record[0] == "Line No":
                header = record
            elif header is not None and len(record) > 4 and record[0] and record[2] == "-":
                # a source line (its SASS lines follow, with an address)
                values = dict(zip(header[4:], record[4:]))
                stalls = sorted(
                    (
                        (name[len("stall_") :], int(value))
                        for name, value in values.items()
                        if name.startswith("stall_") and "Not Issued" not in name and value.isdigit() and int(value) > 0
                    ),
                    key=lambda item: -item[1],
                )[:3]
                rows.append(
                    (
                        int(values.get(SAMPLES) or 0),
                        file,
                        record[0],
                        record[1].strip()[:72],
                        values.get(EXECUTED, "0"),
                        stalls,
                    )
                )
    return rows


def main() -> None:
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    rows = source_lines(path)
    total = max(sum(row[0] for row in rows), 1)
    print(f"{total} samples")
    for samples, file, line, source, executed, stalls in sorted(rows, key=lambda r: -r[0])[:top]:
        reasons = ", ".join(f"{name}={count}" for name, count in stalls)
        print(f"{samples:6d} {100 * samples / total:5.1f}% {file}:{line} ins={executed} {source} | {reasons}")


if __name__ == "__main__":
    main()
