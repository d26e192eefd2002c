"""A run shared by several processes, on one host or several: the `run` arguments every rank is
launched with, the paths only rank 0 reads, joining the process group before anything is read,
checking that every rank runs rank 0's specval, rank 0 running the protocol and dismissing the
others with its exit status, and the other ranks collecting their share of its chunks
(specval.distribution.sharding).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from specval import execution
from specval.cli.common import EXIT_INPUT, fail_with, given


class LeaderPath(click.Path):
    """A click.Path that rank 0 alone reads (the bundle of --resume, the key of --sign). Outside
    torchrun it is checked as click.Path checks it. Under torchrun it is taken as written while the
    command line is parsed: another rank reads no file of the run (its host need not hold it), and
    rank 0 checks it once every rank has joined (`check_leader_paths`), so that its refusal reaches
    the other ranks rather than leaving them waiting for it to join."""

    def convert(self, value, param, ctx):
        if sharding_environment(os.environ):
            return self.coerce_path_result(value)
        return super().convert(value, param, ctx)

    def check(self, value, param, ctx) -> None:
        """click.Path's checks of `value` (exists, file or folder): click.BadParameter, exit 2."""
        super().convert(value, param, ctx)


def sharding_environment(environ) -> bool:
    """Whether `environ` is that of a torchrun rank (WORLD_SIZE > 1)."""
    from specval.distribution import sharding

    return sharding.from_environment(dict(environ)) is not None


def check_leader_paths(ctx: click.Context) -> None:
    """Rank 0, once joined: the checks that `LeaderPath` put off, as click makes them (a usage
    error, exit 2, which dismisses every rank)."""
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if isinstance(param.type, LeaderPath) and value is not None:
            param.type.check(value, param, ctx)


def forwarded_args(ctx: click.Context, leave_out: tuple[str, ...] = ("devices",)) -> list[str]:
    """The `run` arguments given on this command line, the parameters named in `leave_out` left out
    (by default --devices: what every rank runs)."""
    args = ["run"]
    for param in ctx.command.params:
        value = ctx.params[param.name]
        if param.name in leave_out or not given(ctx, param.name):
            continue
        if isinstance(param, click.Argument):
            args.append(str(value))
        elif param.is_flag:
            args.append(param.opts[0])
        else:
            args += [param.opts[0], str(value)]
    return args


def suite_options(ctx: click.Context) -> list[str]:
    """The options of a suite's `run` that each member launched over ranks runs with
    (`specval.cli.suite.member_launch`): all given but the suite's file, --devices and --junit."""
    return forwarded_args(ctx, leave_out=("protocol_file", "devices", "junit"))[1:]


def run_sharded(shards, source: Path, lead: Callable[[], None]) -> None:
    """Join the process group (its backend from this host) before anything is read; check that
    every rank runs rank 0's specval (`sharding.greet`); rank 0 then reads `source` (the protocol
    file, or the bundle's copy for --resume) for its device and runs `lead` (everything `run` does
    in one process), and dismisses the other ranks with its exit code, whatever ends it; the other
    ranks read nothing, collect until dismissed and exit with that code."""
    from specval.distribution import sharding

    try:
        sharding.join(shards)
    except (RuntimeError, ValueError) as err:
        fail_with(EXIT_INPUT, f"error: rank {shards.rank} cannot join the process group: {err}")
    try:
        if not shards.is_leader:
            sys.exit(_serve(shards))
        try:
            _lead(shards, source, lead)
        except BaseException as err:
            sys.stdout.flush()  # the launcher may end this process as soon as another rank exits
            sys.stderr.flush()
            sharding.dismiss(_exit_status(err))
            raise
    finally:
        sharding.leave()


def _lead(shards, source: Path, lead: Callable[[], None]) -> None:
    """Rank 0: refuse a rank whose specval differs from its own, then run `lead` on this rank's
    device; a refusal (`sharding.RankRefused`: a different specval or adapter, a missing GPU) is
    exit 2 with its line, nothing claimed."""
    from specval.distribution import sharding

    try:
        try:
            with execution.signals_interrupt():
                sharding.greet(shards)
        except KeyboardInterrupt:  # interrupted, or a rank lost, while greeting: nothing read or claimed
            fail_with(execution.EXIT_INTERRUPTED, "interrupted; no seed was claimed")
        sharding.use_device(sharding.protocol_device(source), shards)
        lead()
    except sharding.RankRefused as err:
        fail_with(EXIT_INPUT, f"error: {err}; no seed was claimed")


def _exit_status(err: BaseException) -> int:
    """The status this process exits with as `err` leaves it (an uncaught exception: Python's 1)."""
    if isinstance(err, SystemExit):
        return err.code if isinstance(err.code, int) else int(err.code is not None)
    if isinstance(err, click.ClickException):  # a usage error: click exits with its code (2)
        return err.exit_code
    return execution.EXIT_INTERRUPTED if isinstance(err, KeyboardInterrupt) else 1


def _serve(shards) -> int:
    """A rank other than 0: rank 0's exit code, or 130 if interrupted (one line if the group broke).
    A specval that differs from rank 0's is told here in one line (rank 0 dismisses with 2)."""
    from specval.distribution import sharding

    try:
        with execution.signals_interrupt():
            difference = sharding.greet(shards)
            if difference is not None:
                click.echo(f"error: {difference}", err=True)
            return sharding.serve(shards)
    except KeyboardInterrupt as err:  # rank 0 tells the user about an interrupt; a lost group is ours to tell
        if isinstance(err, sharding.RankLost):
            click.echo(f"rank {shards.rank}: {err}", err=True)
        return execution.EXIT_INTERRUPTED
