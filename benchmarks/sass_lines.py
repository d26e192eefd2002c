"""Static SASS instruction counts of the batched_probabilities kernels, by source line, on any
machine (no GPU): each kernel is compiled for sm_90 as a device would at its first launch
(float32 logits, int64 top-k, V = 152,064, every pointer and V specialised as divisible by 16,
as Triton specialises them there) and its cubin disassembled with the nvdisasm Triton ships.

A static count is the number of instructions in the code, not how many run: unrolled loops count
every step, and branches that rarely run (the chunk kernel's pivot-level search, greedy rows)
count in full. For the chunk kernel, whose code is nearly straight-line, it is close to the
instructions one program executes (Nsight Compute's "Instructions Executed" per program); it
shows what a change of the kernel's code does to its instruction count before any GPU time.

Usage, from the repository root (without TRITON_INTERPRET):
    python3 -m benchmarks.sass_lines [--kernel chunk|select|write|single] [--top 25]
        [--rows 32] [--line chunk.py:150]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton

from engine.sampling.kernels.cross_compile import VOCAB, compile_cubin, device_launches
from engine.sampling.kernels.probabilities import DEFAULT_CONFIG

LINE_MARK = re.compile(r'//## File "([^"]+)", line (\d+)')
INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def disassemble(cubin: bytes) -> str:
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm, "-g", "-c", f.name], capture_output=True, text=True, check=True).stdout


def by_line(sass: str) -> tuple[collections.Counter, collections.Counter, dict]:
    """(instructions by "file:line", by opcode, SASS text by "file:line")."""
    lines, opcodes, text, current = collections.Counter(), collections.Counter(), {}, "?"
    for row in sass.splitlines():
        mark = LINE_MARK.search(row)
        if mark:
            current = f"{mark.group(1).rsplit('/', 1)[-1]}:{mark.group(2)}"
            continue
        instruction = INSTRUCTION.match(row)
        if instruction:
            lines[current] += 1
            opcodes[instruction.group(1).split(".")[0]] += 1
            text.setdefault(current, []).append(row.strip())
    return lines, opcodes, text


def kernel_launch(name: str, rows: int) -> tuple:
    """(kernel, constexprs, warps, V, options) of the named kernel as a Hopper device launches
    it with the default configuration."""
    launch = device_launches(DEFAULT_CONFIG, rows, VOCAB)[name]
    return launch.kernel, launch.constexprs, launch.num_warps, VOCAB, launch.options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="chunk", choices=("chunk", "select", "write", "single"))
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--line", help="also print the SASS of this file:line")
    args = parser.parse_args()
    cubin = compile_cubin(*kernel_launch(args.kernel, args.rows))
    lines, opcodes, text = by_line(disassemble(cubin))
    print(f"{args.kernel} kernel, B = {args.rows}, V = {VOCAB}: {sum(lines.values())} SASS instructions")
    print("| instructions | source line |\n| ---: | --- |")
    for line, count in lines.most_common(args.top):
        print(f"| {count} | {line} |")
    print("opcodes: " + ", ".join(f"{op} {n}" for op, n in opcodes.most_common(12)))
    for row in text.get(args.line, []) if args.line else []:
        print(row)


if __name__ == "__main__":
    main()
