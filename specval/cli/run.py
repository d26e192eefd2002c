"""`specval run`: a protocol file, or --resume of an unsealed bundle, dispatched by its kind to a
suite, a performance run, a launch of several ranks, or a run in this process.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import click

from specval import bundle as bundles
from specval.cli.common import (
    bundle_kind_of,
    check_performance_flags,
    check_run_flags,
    check_sharded,
    check_suite_flags,
    input_error,
    kind_of,
    read,
    signer_of,
)
from specval.cli.performance import run_bench
from specval.cli.ranks import LeaderPath, check_leader_paths, forwarded_args, run_sharded, suite_options
from specval.cli.runner import run_here
from specval.cli.suite import run_suite
from specval.kinds import SUITE_KIND
from specval.performance.protocol import PERFORMANCE_KIND


@click.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--profile", default=None, help="Scale profile of the protocol (e.g. ci, full).")
@click.option(
    "--output",
    default=Path("results"),
    type=click.Path(path_type=Path),
    show_default=True,
    help="Root directory of bundles and of the seed ledger.",
)
@click.option(
    "--resume",
    default=None,
    type=LeaderPath(file_okay=False, exists=True, path_type=Path),
    help="Continue a killed or failed run in this unsealed bundle (its protocol and seeds are reused).",
)
@click.option(
    "--exploratory",
    is_flag=True,
    help="Run a protocol that is not frozen in frozen.lock, or changed since; the verdict says EXPLORATORY.",
)
@click.option("--confirmatory", is_flag=True, help="The default: refuse a protocol that is not frozen as written.")
@click.option(
    "--seed-offset",
    default=None,
    type=click.IntRange(min=0),
    help="First seed of the run (still checked against the ledger).",
)
@click.option("--junit", default=None, type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option(
    "--devices",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Processes sharing the collection (one per GPU for a CUDA protocol): launches "
    "`torchrun --nproc-per-node N -m specval run ...` through torch.distributed.run.",
)
@click.option(
    "--sign",
    "sign_key",
    default=None,
    type=LeaderPath(dir_okay=False, exists=True, path_type=Path),
    help="Sign the sealed bundle with this ed25519 private key (PEM, as `specval keygen` writes).",
)
@click.pass_context
def run(
    ctx, protocol_file, profile, output, resume, exploratory, confirmatory, seed_offset, junit, quiet, devices, sign_key
) -> None:
    """Run PROTOCOL_FILE (or --resume BUNDLE) and print the verdict and the bundle path.

    Exit status: 0 PASS, 1 FAIL, 2 input or usage error (nothing claimed), 3 the system under test
    raised or exited (the bundle is kept for --resume; the traceback is in a log file), 4
    INCONCLUSIVE, 5 environment error (disk full, file too large, permissions: the bundle is kept for
    --resume), 130 interrupted (the bundle is kept for --resume). Started by torchrun (WORLD_SIZE > 1), on
    one host or several, every rank joins the group first; rank 0 alone reads the files and runs the
    protocol, and the other ranks collect their share of its chunks (specval.distribution.sharding)."""
    from specval.distribution import sharding

    check_run_flags(ctx, protocol_file, resume, exploratory, confirmatory)
    shards = sharding.from_environment(dict(os.environ))
    lead = functools.partial(_run, ctx, shards, **ctx.params)
    if shards is None:
        return lead()
    return run_sharded(shards, protocol_file or resume / bundles.PROTOCOL_YAML, lead)


def _run(
    ctx,
    shards,
    *,
    protocol_file,
    profile,
    output,
    resume,
    exploratory,
    confirmatory,
    seed_offset,
    junit,
    quiet,
    devices,
    sign_key,
) -> None:
    """`run` in this process (rank 0 of a multi-rank run: `shards`, the group already joined):
    everything that reads a file of the run."""
    from specval.distribution import sharding

    if shards is not None:
        check_leader_paths(ctx)
    signer = signer_of(sign_key)  # a bad key is refused before anything is claimed
    source, read_file = protocol_file or resume / bundles.PROTOCOL_YAML, None
    if devices > 1 or shards is not None:
        read_file = read(source)  # the bundle's copy for --resume
        if shards is not None or kind_of(read_file).name != SUITE_KIND:  # a suite checks its members
            check_sharded(source, kind_of(read_file), devices, shards)
    if resume is not None and not bundle_kind_of(resume).resumable:
        input_error(
            f"{resume}: a performance bundle is not resumable (timings of two sessions are not "
            f"comparable); start a new run: specval bench {resume / bundles.PROTOCOL_YAML}"
        )
    given = None if protocol_file is None else (read_file or read(protocol_file))  # the file is read once
    if kind_of(given).name == SUITE_KIND:
        check_suite_flags(ctx)
        options = suite_options(ctx) if devices > 1 else None
        run_suite(given, protocol_file, profile, output, exploratory, quiet, signer, junit, options, devices)
    if kind_of(given).name == PERFORMANCE_KIND:
        check_performance_flags(ctx)
        run_bench(given, protocol_file, profile, output, exploratory, quiet, signer)
    if devices > 1:
        sys.exit(sharding.launch(devices, forwarded_args(ctx)))
    run_args = (given, protocol_file, profile, output, resume, exploratory, seed_offset, junit, quiet, signer)
    return run_here(*run_args, shards=shards)
