"""`specval run` of a suite: every member read and checked before any runs, then run in order
(`specval.suite`), one line per member, the suite's verdict and record, and its exit status. With
--devices N every distribution and sequence member runs over N torchrun ranks (`specval run MEMBER
--devices N`, one launch after another); members of other kinds run in this process.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import click

from specval import execution
from specval import protocol as protocols
from specval.cli.common import EXIT_ENVIRONMENT, EXIT_PASS, SHARDED_KINDS, check_sharded, fail_with, input_error, read
from specval.cli.runner import run_here
from specval.kinds import RUN_KINDS, ProtocolFile


def _suite_members(
    spec, suite_file: Path, profile: str | None, exploratory: bool
) -> list[tuple[Path, ProtocolFile, object]]:
    """Every member of a suite, read, registration-checked and resolved with `profile` (ProtocolError
    naming the member file: nothing has run yet)."""
    members = []
    for path in spec.member_paths(suite_file):
        if not path.is_file():
            raise protocols.ProtocolError(f"{suite_file}: members: {path} does not exist")
        given = read(path)
        if given.kind.name not in RUN_KINDS:
            raise protocols.ProtocolError(
                f"{suite_file}: members: {path} is of kind {given.kind.name}; a suite lists "
                f"protocols of kinds {', '.join(RUN_KINDS)}"
            )
        protocol = given.load()
        protocols.check_registered(protocol, path, exploratory)
        members.append((path, given, protocols.resolve(protocol, profile)))
    return members


def run_suite(
    given: ProtocolFile,
    suite_file: Path,
    profile,
    output: Path,
    exploratory: bool,
    quiet: bool,
    signer,
    junit=None,
    launch_args: list[str] | None = None,
    devices: int = 1,
) -> None:
    """Run every member of the suite `given` in order (`specval.suite`), print one line per member
    and the suite's verdict, write the suite record and, with `junit`, one JUnit file holding a
    <testsuite> per member run (its folders created; checked writable before any member runs);
    exit with the most severe member status. With `devices` > 1 the members of sharded kinds are
    launched over that many ranks with `launch_args` (this command's options: `member_launch`),
    each checked for it (GPUs of a CUDA member) before any member runs."""
    from specval import suite as suites
    from specval.preflight import check_writable_dir
    from specval.report.junit import check_target

    started = dt.datetime.now(dt.timezone.utc).isoformat()
    try:
        spec = given.load()
        state = protocols.check_registered(spec, suite_file, exploratory)
        members = _suite_members(spec, suite_file, profile, exploratory)
        for path, member, _ in members:
            if devices > 1 and member.kind.name in SHARDED_KINDS:
                check_sharded(path, member.kind, devices, None)
        check_writable_dir(Path(output), "--output")
        if junit:
            check_target(junit, "--junit")
    except protocols.ProtocolError as err:
        input_error(err)
    try:
        directory = suites.new_directory(output, spec.name)
    except OSError as err:
        fail_with(EXIT_ENVIRONMENT, f"error: environment: {execution.describe_os_error(err)}; nothing ran")
    launch = None if devices <= 1 else (devices, launch_args or [])
    results = _run_members(spec.name, members, directory, profile, output, exploratory, quiet, signer, launch)
    data = suites.record(directory, spec, suite_file, profile, state, results, started)
    click.echo(
        f"== suite {spec.name} ({'EXPLORATORY, ' if exploratory and state != protocols.FROZEN else ''}"
        f"profile {profile or 'as written'}):"
    )
    for member in data["members"]:
        click.echo(f"  {member['verdict']:<12} exit {member['exit']}  {member['file']}  {member['bundle'] or '-'}")
    final = results[-1].exit if results and results[-1].exit == execution.EXIT_INTERRUPTED else data["exit"]
    click.echo(
        f"{data['verdict'] if final == data['exit'] else 'INTERRUPTED'}: suite {spec.name}, "
        f"{len(results)} of {len(members)} member(s) run; record: {directory / suites.SUITE_FILE}"
    )
    if junit:
        _write_junit(junit, suites.junit_report(spec, results))
    sys.exit(final)


def _run_members(name, members, directory: Path, profile, output, exploratory, quiet, signer, launch=None) -> list:
    """Run the members in order (each writes its own JUnit file into the suite's `directory`) and
    return their `specval.suite.MemberResult`s; an interrupt stops after the member it hit.
    `launch`: (devices, the command's options) to run the members of sharded kinds over ranks."""
    from specval import suite as suites

    results = []
    for index, (path, member, protocol) in enumerate(members, start=1):
        click.echo(f"== suite {name}: member {index}/{len(members)}: {path}")
        announced: list[Path] = []
        junit = directory / f"{protocol.name}.junit.xml"
        if launch is not None and member.kind.name in SHARDED_KINDS:
            code, bundle = _launch_member(launch, path, protocol.name, Path(output), junit)
            results.append(suites.MemberResult(str(path), protocol.name, protocol.hash, code, bundle))
            if code == execution.EXIT_INTERRUPTED:
                break
            continue
        try:
            run_here(
                member,
                path,
                profile,
                output,
                None,
                exploratory,
                None,
                junit,
                quiet,
                signer,
                announced=announced,
            )
            code = EXIT_PASS  # run_here always exits; kept for clarity
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else int(done.code is not None)
        results.append(
            suites.MemberResult(str(path), protocol.name, protocol.hash, code, announced[0] if announced else None)
        )
        if code == execution.EXIT_INTERRUPTED:
            break
    return results


def _launch_member(launch, path: Path, name: str, output: Path, junit: Path) -> tuple[int, Path | None]:
    """`specval run PATH --devices N` with the suite's options (`member_launch`): rank 0's exit code
    and the member's bundle, the one new folder named after it under `output` (None if none)."""
    from specval.distribution import sharding

    devices, options = launch
    before = set(output.glob(f"{name}-*"))
    code = sharding.launch(devices, member_launch(options, path, junit))
    new = list(set(output.glob(f"{name}-*")) - before)
    return code, new[0] if len(new) == 1 else None


def member_launch(options: list[str], member: Path, junit: Path) -> list[str]:
    """The `run` arguments of one member launched over ranks: the member's file, the suite command's
    options (`ranks.suite_options`) and the member's own JUnit file."""
    return ["run", str(member), *options, "--junit", str(junit)]


def _write_junit(path: Path, report) -> None:
    """Write the suite's JUnit file; exit 5 with one line if the operating system refuses it."""
    from specval.report.junit import write_xml

    try:
        write_xml(report, path)
    except OSError as err:
        fail_with(
            EXIT_ENVIRONMENT,
            f"error: environment: --junit {path}: cannot write ({execution.describe_os_error(err)}); "
            "the suite's verdict above stands",
        )
    click.echo(f"junit: {path}")
