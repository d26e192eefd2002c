"""Collection throughput: samples/s of `SUT.sample` per group and batch size, the harness's hot loop.

    python -m benchmarks.collection protocols/t2_cuda.yaml [--batch-sizes 128 1024 4096]
        [--samples 16384] [--groups nospec sync] [--set max_num_seqs=4096 ...]
        [--profile GROUP:BATCH ...] [--out table.md]

Each (group, batch size) cell calls `sut.sample` exactly as `specval.distribution.collect` does (consecutive
seeds, the protocol's prompt, sampling, positions and max_tokens) until `--samples` samples are
drawn, after one warm-up call of the same batch size (which compiles kernels and captures any
graphs the measured calls use). samples/s = samples / wall time of the measured calls; the
device is synchronised before each clock read. The engine options are the protocol's
`sut.options`, then `max_num_seqs` and `num_kv_blocks` raised to fit the batch (a request
needs at most `ceil((prompt + max_tokens + K) / block_size)` blocks per depth, twice for the
rounds in flight), then `--set` overrides.

`--profile GROUP:BATCH ...` runs each named cell again under cProfile (host time by function, the
top 25 by own time) and torch.profiler (device time by kernel, the top 15), and prints both.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import platform
import pstats
import sys
import time
from dataclasses import replace
from pathlib import Path

if not __package__:  # run as a file: this file's folder would shadow the `engine` package
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from specval.protocol import load_protocol  # noqa: E402
from specval.sut import open_sut  # noqa: E402

DEFAULT_BATCH_SIZES = (128, 1024, 4096)
BLOCKS_PER_REQUEST_DEPTH_MARGIN = 2  # rounds in flight: the scheduler may hold two rounds' blocks
PROFILE_TOP_HOST = 25
PROFILE_TOP_DEVICE = 15


def parse_value(text: str):
    """'4096' -> 4096, 'true' -> True, anything else stays a string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def engine_options(protocol, batch_size: int, num_depths: int, overrides: dict) -> dict:
    """The protocol's options with max_num_seqs / num_kv_blocks raised to fit one batch."""
    options = dict(protocol.sut.options)
    block_size = options.get("block_size", 16)
    longest = 64 + max(protocol.max_tokens(g) for g in protocol.groups) + protocol.num_speculative_tokens
    per_request = -(-longest // block_size) * num_depths * BLOCKS_PER_REQUEST_DEPTH_MARGIN
    options["max_num_seqs"] = max(options.get("max_num_seqs", 1024), batch_size)
    options["num_kv_blocks"] = max(options.get("num_kv_blocks", 16384), per_request * batch_size)
    options.update(overrides)
    return options


def open_for(protocol, batch_size: int, overrides: dict):
    sut_probe = open_sut(protocol.sut, protocol.num_speculative_tokens)
    depths = sut_probe._any_llm().engine.model.num_depths
    sut_probe.close()
    spec = replace(protocol.sut, options=tuple(sorted(engine_options(protocol, batch_size, depths, overrides).items())))
    return open_sut(spec, protocol.num_speculative_tokens)


def sync_device() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_cell(sut, protocol, prompt_ids, group, batch_size: int, num_samples: int, seed0: int = 0) -> float:
    """Wall seconds of sampling `num_samples` seeds in batches of `batch_size` (after a warm-up)."""

    def call(start, count):
        seeds = np.arange(start, start + count, dtype=np.int64)
        sut.sample(group, prompt_ids, protocol.sampling, seeds, protocol.positions, protocol.max_tokens(group))

    call(seed0, batch_size)  # warm-up: compiles kernels, captures graphs
    sync_device()
    begin = time.perf_counter()
    for start in range(0, num_samples, batch_size):
        call(seed0 + batch_size + start, min(batch_size, num_samples - start))
    sync_device()
    return time.perf_counter() - begin


def profile_cell(sut, protocol, prompt_ids, group, batch_size: int, num_samples: int) -> str:
    """cProfile (host) and torch.profiler (device) summaries of one cell."""
    run_cell(sut, protocol, prompt_ids, group, batch_size, batch_size)  # warm
    host = cProfile.Profile()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        host.enable()
        wall = run_cell(sut, protocol, prompt_ids, group, batch_size, num_samples, seed0=10**6)
        host.disable()
    text = io.StringIO()
    pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(PROFILE_TOP_HOST)
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    device = prof.key_averages().table(sort_by=sort, row_limit=PROFILE_TOP_DEVICE)
    return (
        f"## profile {group.name} batch {batch_size}: {num_samples} samples, {wall:.3f} s under "
        f"the profilers\n\n```\n{text.getvalue()}\n{device}\n```\n"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("protocol")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(DEFAULT_BATCH_SIZES))
    parser.add_argument("--samples", type=int, default=16384, help="measured samples per cell")
    parser.add_argument("--groups", nargs="+", default=None, help="default: every group")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="engine option overrides")
    parser.add_argument("--profile", nargs="*", default=[], metavar="GROUP:BATCH")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    protocol = load_protocol(args.protocol)
    overrides = {k: parse_value(v) for k, v in (item.split("=", 1) for item in args.set)}
    groups = [protocol.group(name) for name in args.groups] if args.groups else list(protocol.groups)
    lines = [
        f"protocol {protocol.name}, device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, "
        f"torch {torch.__version__}, python {platform.python_version()}, overrides {overrides}",
        "",
        "| group | batch | samples | seconds | samples/s |",
        "|---|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    profiles = []
    for batch_size in args.batch_sizes:
        sut = open_for(protocol, batch_size, overrides)
        prompt_ids = sut.encode(protocol.prompt)
        for group in groups:
            seconds = run_cell(sut, protocol, prompt_ids, group, batch_size, args.samples)
            row = f"| {group.name} | {batch_size} | {args.samples} | {seconds:.3f} | {args.samples / seconds:,.0f} |"
            lines.append(row)
            print(row, flush=True)
            if f"{group.name}:{batch_size}" in args.profile:
                profiles.append(profile_cell(sut, protocol, prompt_ids, group, batch_size, args.samples))
        sut.close()
    text = "\n".join(lines) + "\n\n" + "\n".join(profiles)
    print("\n".join(profiles))
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
