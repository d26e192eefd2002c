"""A run shared by several processes: the `run` arguments every rank is launched with, joining
the process group, rank 0 running the protocol and dismissing the others with its exit status,
and the other ranks collecting their share of its chunks (specval.distribution.sharding).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specval import execution
from specval.cli.common import EXIT_INPUT, fail_with, given
from specval.cli.runner import run_here


def forwarded_args(ctx: click.Context) -> list[str]:
    """The `run` arguments given on this command line, --devices left out: what every rank runs."""
    args = ["run"]
    for param in ctx.command.params:
        value = ctx.params[param.name]
        if param.name == "devices" or not given(ctx, param.name):
            continue
        if isinstance(param, click.Argument):
            args.append(str(value))
        elif param.is_flag:
            args.append(param.opts[0])
        else:
            args += [param.opts[0], str(value)]
    return args


def run_sharded(shards, source: Path, run_args: tuple) -> None:
    """Join the process group (its backend from `source`, the protocol file); rank 0 runs the
    protocol (`runner.run_here(*run_args)`) and dismisses the other ranks with its exit code, the other
    ranks collect until dismissed and exit with that code."""
    from specval.distribution import sharding

    try:
        sharding.join(shards, sharding.protocol_device(source))
    except (RuntimeError, ValueError) as err:
        fail_with(EXIT_INPUT, f"error: rank {shards.rank} cannot join the process group: {err}")
    try:
        if not shards.is_leader:
            sys.exit(_serve(shards))
        try:
            run_here(*run_args, shards=shards)
        except BaseException as err:
            sys.stdout.flush()  # the launcher may end this process as soon as another rank exits
            sys.stderr.flush()
            sharding.dismiss(_exit_status(err))
            raise
    finally:
        sharding.leave()


def _exit_status(err: BaseException) -> int:
    """The status this process exits with as `err` leaves it (an uncaught exception: Python's 1)."""
    if isinstance(err, SystemExit):
        return err.code if isinstance(err.code, int) else int(err.code is not None)
    return execution.EXIT_INTERRUPTED if isinstance(err, KeyboardInterrupt) else 1


def _serve(shards) -> int:
    """A rank other than 0: rank 0's exit code, or 130 if interrupted (one line if the group broke)."""
    from specval.distribution import sharding

    try:
        with execution.signals_interrupt():
            return sharding.serve(shards)
    except KeyboardInterrupt as err:  # rank 0 tells the user about an interrupt; a lost group is ours to tell
        if isinstance(err, sharding.RankLost):
            click.echo(f"rank {shards.rank}: {err}", err=True)
        return execution.EXIT_INTERRUPTED
