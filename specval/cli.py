"""Command-line interface of specval (click).

Exit status, one meaning each (see specval.execution): 0 PASS (only once a PASS verdict is
written), 1 FAIL (or a bundle that does not verify, a protocol changed since frozen), 2 usage or
input error (bad protocol, overlapping seeds, unsupported group, unreadable bundle), 3 the system
under test raised or exited, 4 INCONCLUSIVE, 5 environment error (an OSError: disk full, file too
large, permissions; a bundle is kept and resumes), 130 interrupted. No command prints a traceback
for any of these.

A command reads a protocol file once and dispatches on its kind through `specval.kinds`.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from specval import __version__, execution, seeds, signing
from specval import bundle as bundles
from specval import protocol as protocols
from specval.kinds import (
    DISTRIBUTION_KIND,
    KINDS,
    OTHER_KINDS,
    RUN_KINDS,
    SUITE_KIND,
    Kind,
    ProtocolFile,
    bundle_kind,
    read_protocol_file,
)
from specval.performance.protocol import PERFORMANCE_KIND
from specval.suite import is_suite_directory as suite_directory

EXIT_PASS, EXIT_FAIL, EXIT_INPUT = execution.EXIT_PASS, execution.EXIT_FAIL, execution.EXIT_INPUT
EXIT_ENVIRONMENT = execution.EXIT_ENVIRONMENT


def _input_error(err: Exception | str) -> None:
    """Exit 2 with one line: a character that is not printable (a newline or a control character
    in a key of the file, say) is written as its escape."""
    click.echo(_printable(f"error: {err}"), err=True)
    sys.exit(EXIT_INPUT)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _read(path: Path | None) -> ProtocolFile | None:
    """PATH's protocol file, read once (exit 2 naming the file if it is not YAML); None when there
    is no file to read (the runner reports that)."""
    if path is None or not path.is_file():
        return None
    try:
        return read_protocol_file(path)
    except protocols.ProtocolError as err:
        _input_error(err)


def _kind(source: ProtocolFile | None) -> Kind:
    """The kind of a protocol file read by `_read`; the distribution kind for none."""
    return KINDS[DISTRIBUTION_KIND] if source is None else source.kind


def _load(path: Path):
    """PATH's protocol, parsed by the parser of its kind (ProtocolError naming the file)."""
    return read_protocol_file(path).load()


def _bundle_kind(bundle: Path) -> Kind:
    """The kind of the protocol BUNDLE ran; exit 2 naming the file unless BUNDLE is a bundle."""
    try:
        return bundle_kind(bundle)
    except bundles.BundleError as err:
        _input_error(err)


class _Cli(click.Group):
    """The command group; an interrupt of any command exits 130 with one line (not click's 'Aborted!', 1),
    and an OSError no command handled (disk full, permissions, a file that is a directory) exits 5 with
    one line (not a traceback). A broken pipe is left to click (it exits quietly)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(execution.EXIT_INTERRUPTED)
        except OSError as err:
            if err.errno == errno.EPIPE:
                raise
            click.echo(f"error: environment: {execution.describe_os_error(err)}", err=True)
            ctx.exit(EXIT_ENVIRONMENT)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specval")
def main() -> None:
    """Prove that a speculative-decoding sampler preserves the target distribution."""


RESUME_CONFLICTS = ("profile", "output", "seed_offset", "confirmatory", "exploratory")  # fixed by the bundle


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def _check_run_flags(ctx: click.Context, protocol_file, resume, exploratory, confirmatory) -> None:
    if (protocol_file is None) == (resume is None):
        raise click.UsageError("give exactly one of PROTOCOL_FILE or --resume BUNDLE")
    if exploratory and confirmatory:
        raise click.UsageError("--exploratory and --confirmatory contradict each other")
    if resume is not None:
        conflicts = [f"--{name.replace('_', '-')}" for name in RESUME_CONFLICTS if _given(ctx, name)]
        if conflicts:
            raise click.UsageError(
                f"--resume continues {resume} with the protocol, profile, seeds, output and "
                f"registration recorded in it; drop {', '.join(conflicts)}"
            )


def _print_verdict(summary: dict, path: Path) -> None:
    for name, test in sorted(summary["tests"].items()):
        click.echo(f"  {test['verdict']:<12} {test['role']:<9} {name}: {test['reason']}")
    marker = "EXPLORATORY " if summary.get("registration", {}).get("exploratory") else ""
    click.echo(f"{marker}{summary['verdict']}: {summary['reason']}")
    click.echo(f"bundle: {path}")


def _announce(path: Path) -> None:
    click.echo(f"bundle: {path} (resume with: {execution.resume_command(path)})")


@main.command()
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
    type=click.Path(file_okay=False, exists=True, path_type=Path),
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
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
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
    --resume), 130 interrupted (the bundle is kept for --resume). Started by torchrun (WORLD_SIZE > 1), rank 0
    runs the protocol and the other ranks collect their share of its chunks (specval.distribution.sharding)."""
    from specval.distribution import sharding

    _check_run_flags(ctx, protocol_file, resume, exploratory, confirmatory)
    signer = _signer(sign_key)  # a bad key is refused before anything is claimed
    shards = sharding.from_environment(dict(os.environ))
    source, read = protocol_file or resume / bundles.PROTOCOL_YAML, None
    if devices > 1 or shards is not None:
        read = _read(source)  # the bundle's copy for --resume
        _check_sharded(source, _kind(read), devices, shards)
    if resume is not None and not _bundle_kind(resume).resumable:
        _input_error(
            f"{resume}: a performance bundle is not resumable (timings of two sessions are not "
            f"comparable); start a new run: specval bench {resume / bundles.PROTOCOL_YAML}"
        )
    given = None if protocol_file is None else (read or _read(protocol_file))  # the file is read once
    if _kind(given).name == SUITE_KIND:
        for name in ("seed_offset", "junit", "devices"):
            if _given(ctx, name):
                raise click.UsageError(
                    f"--{name.replace('_', '-')} does not apply to a suite (each member's JUnit "
                    "file is written into the suite's directory)"
                )
        _run_suite(given, protocol_file, profile, output, exploratory, quiet, signer)
    if _kind(given).name == PERFORMANCE_KIND:
        for name in ("seed_offset", "junit"):
            if _given(ctx, name):
                raise click.UsageError(f"--{name.replace('_', '-')} does not apply to a performance protocol")
        _bench(given, protocol_file, profile, output, exploratory, quiet, signer)
    if devices > 1:
        sys.exit(sharding.launch(devices, _forwarded_args(ctx)))
    run_args = (given, protocol_file, profile, output, resume, exploratory, seed_offset, junit, quiet, signer)
    if shards is None:
        return _run_here(*run_args)
    return _run_sharded(shards, source, run_args)


def _check_sharded(protocol_file: Path, kind: Kind, devices: int, shards) -> None:
    """Refusals of a multi-rank run of `protocol_file` (the bundle's copy for --resume) of `kind`,
    made by every rank before any rank joins the group (exit 2)."""
    if devices > 1 and shards is not None:
        raise click.UsageError("--devices launches torchrun; inside a torchrun-started process drop it")
    if kind.name in OTHER_KINDS:
        raise click.UsageError(f"multi-process runs take distribution protocols only, not kind: {kind.name}")
    if devices > 1:
        _check_gpus(protocol_file, devices)


def _check_gpus(protocol_file: Path, devices: int) -> None:
    """--devices N of a CUDA protocol needs N GPUs (rank r runs on cuda:r)."""
    from specval.distribution import sharding

    if sharding.protocol_device(protocol_file).startswith(sharding.CUDA_PREFIX):
        import torch

        if torch.cuda.device_count() < devices:
            raise click.UsageError(
                f"--devices {devices}: {protocol_file} runs on CUDA and this host has "
                f"{torch.cuda.device_count()} GPU(s)"
            )


def _forwarded_args(ctx: click.Context) -> list[str]:
    """The `run` arguments given on this command line, --devices left out: what every rank runs."""
    args = ["run"]
    for param in ctx.command.params:
        value = ctx.params[param.name]
        if param.name == "devices" or not _given(ctx, param.name):
            continue
        if isinstance(param, click.Argument):
            args.append(str(value))
        elif param.is_flag:
            args.append(param.opts[0])
        else:
            args += [param.opts[0], str(value)]
    return args


def _run_sharded(shards, source: Path, run_args: tuple) -> None:
    """Join the process group (its backend from `source`, the protocol file); rank 0 runs the
    protocol (`_run_here(*run_args)`) and dismisses the other ranks with its exit code, the other
    ranks collect until dismissed and exit with that code."""
    from specval.distribution import sharding

    try:
        sharding.join(shards, sharding.protocol_device(source))
    except (RuntimeError, ValueError) as err:
        _fail_with(EXIT_INPUT, f"error: rank {shards.rank} cannot join the process group: {err}")
    try:
        if not shards.is_leader:
            sys.exit(_serve(shards))
        try:
            _run_here(*run_args, shards=shards)
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


def _run_here(
    given: ProtocolFile | None,
    protocol_file,
    profile,
    output,
    resume,
    exploratory,
    seed_offset,
    junit,
    quiet,
    signer=None,
    shards=None,
    announced: list[Path] | None = None,
) -> None:
    """The run of `given` (PROTOCOL_FILE as read by `_read`; None for --resume) through the Python
    API's `specval.api.run_protocol_file` (its kind's runner: distribution or quality, the same run()
    contract) in this process (rank 0 of a sharded run: with the other ranks collecting); exits.
    `announced` (a suite's member run) receives the bundle's path once it exists."""
    from specval import api
    from specval.preflight import SUTRaised, check_writable_file
    from specval.report.junit import write_junit
    from specval.sut import SUTError

    extra = {} if shards is None else {"shards": shards}
    announced = [] if announced is None else announced
    try:
        if junit:
            check_writable_file(junit, "--junit")
        with execution.signals_interrupt():
            result = api.run_protocol_file(
                given,
                protocol_file,
                profile,
                output,
                resume=resume,
                exploratory=exploratory,
                seed_offset=seed_offset,
                progress=not quiet,
                announce=_recording(announced, _announce),
                **extra,
            )
    except SUTError as err:  # the system under test refused the protocol's sut settings
        _input_error(f"{protocol_file or resume}: sut: {err}")
    except (protocols.ProtocolError, seeds.SeedOverlapError, bundles.BundleError) as err:
        _input_error(err)
    except SUTRaised as err:  # the probe, before any seed was claimed
        log = execution.append_log(resume / execution.ERROR_LOG, err) if resume else execution.probe_log(output, err)
        _fail_with(execution.EXIT_SUT, f"error: {err}; no seed was claimed; traceback in {log}")
    except execution.RunFailed as err:
        _fail_with(
            execution.EXIT_SUT,
            f"error: {err}; traceback in {err.log}; the bundle {err.path} is marked "
            f"ERROR and kept; resume with: {execution.resume_command(err.path)}",
        )
    except execution.RunInterrupted as err:
        _interrupted(err.path)
    except KeyboardInterrupt:
        _interrupted(None)
    except (execution.EnvironmentFailed, OSError, SystemExit, seeds.LedgerError) as err:
        _no_verdict(err, announced, lambda path: _kept(path) if path else NOT_ANNOUNCED)
    _print_verdict(result.summary, result.bundle)
    _sign_sealed(result.bundle, signer)
    if junit:
        try:
            write_junit(result.summary, junit, result.bundle)
        except OSError as err:
            _fail_with(
                EXIT_ENVIRONMENT,
                f"error: environment: --junit {junit}: cannot write "
                f"({execution.describe_os_error(err)}); the verdict above stands",
            )
    sys.exit(execution.verdict_exit(result.verdict))


def _suite_members(
    spec, suite_file: Path, profile: str | None, exploratory: bool
) -> list[tuple[Path, ProtocolFile, object]]:
    """Every member of a suite, read, registration-checked and resolved with `profile` (ProtocolError
    naming the member file: nothing has run yet)."""
    members = []
    for path in spec.member_paths(suite_file):
        if not path.is_file():
            raise protocols.ProtocolError(f"{suite_file}: members: {path} does not exist")
        given = _read(path)
        if given.kind.name not in RUN_KINDS:
            raise protocols.ProtocolError(
                f"{suite_file}: members: {path} is of kind {given.kind.name}; a suite lists "
                f"protocols of kinds {', '.join(RUN_KINDS)}"
            )
        protocol = given.load()
        protocols.check_registered(protocol, path, exploratory)
        members.append((path, given, protocols.resolve(protocol, profile)))
    return members


def _run_suite(
    given: ProtocolFile, suite_file: Path, profile, output: Path, exploratory: bool, quiet: bool, signer
) -> None:
    """Run every member of the suite `given` in order (`specval.suite`), print one line per member
    and the suite's verdict, write the suite record; exit with the most severe member status."""
    from specval import suite as suites
    from specval.preflight import check_writable_dir

    started = dt.datetime.now(dt.timezone.utc).isoformat()
    try:
        spec = given.load()
        state = protocols.check_registered(spec, suite_file, exploratory)
        members = _suite_members(spec, suite_file, profile, exploratory)
        check_writable_dir(Path(output), "--output")
    except protocols.ProtocolError as err:
        _input_error(err)
    try:
        directory = suites.new_directory(output, spec.name)
    except OSError as err:
        _fail_with(EXIT_ENVIRONMENT, f"error: environment: {execution.describe_os_error(err)}; nothing ran")
    results = []
    for index, (path, member, protocol) in enumerate(members, start=1):
        click.echo(f"== suite {spec.name}: member {index}/{len(members)}: {path}")
        announced: list[Path] = []
        try:
            _run_here(
                member,
                path,
                profile,
                output,
                None,
                exploratory,
                None,
                directory / f"{protocol.name}.junit.xml",
                quiet,
                signer,
                announced=announced,
            )
            code = EXIT_PASS  # _run_here always exits; kept for clarity
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else int(done.code is not None)
        results.append(
            suites.MemberResult(str(path), protocol.name, protocol.hash, code, announced[0] if announced else None)
        )
        if code == execution.EXIT_INTERRUPTED:
            break
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
    sys.exit(final)


def _recording(announced: list[Path], announce: Callable[[Path], None]) -> Callable[[Path], None]:
    """`announce`, also appending the bundle's path to `announced` (what an error message names)."""

    def record(path: Path) -> None:
        announced.append(path)
        announce(path)

    return record


def _kept(path: Path) -> str:
    return f"; the bundle {path} is kept; resume with: {execution.resume_command(path)}"


NOT_ANNOUNCED = "; no bundle was announced"


def _no_verdict(err: BaseException, announced: list[Path], where: Callable[[Path | None], str]) -> None:
    """A run that ended without a verdict, with one line: exit 5 for an OSError of the harness
    (EnvironmentFailed or a bare OSError) or an unreadable seed ledger, 3 for a SystemExit of code the run called outside the
    guarded adapter calls (never its status: 0 would read as PASS). `where(path)` tells what became
    of the bundle (EnvironmentFailed's, else the announced one; None: none was announced)."""
    path = err.path if isinstance(err, execution.EnvironmentFailed) else (announced[0] if announced else None)
    if isinstance(err, SystemExit):
        _fail_with(
            execution.EXIT_SUT, f"error: the run was ended by SystemExit({err.code!r}) before any verdict{where(path)}"
        )
    if isinstance(err, seeds.LedgerError):  # the output root's state, like a ledger.json that is a directory
        _fail_with(EXIT_ENVIRONMENT, f"error: environment: {err}{where(path)}")
    cause = err.cause if isinstance(err, execution.EnvironmentFailed) else err
    _fail_with(EXIT_ENVIRONMENT, f"error: environment: {execution.describe_os_error(cause)}{where(path)}")


def _fail_with(code: int, line: str) -> None:
    click.echo(line, err=True)
    sys.exit(code)


def _interrupted(path: Path | None) -> None:
    _fail_with(execution.EXIT_INTERRUPTED, f"interrupted{_kept(path) if path else '; no bundle was started'}")


def _bench(
    given: ProtocolFile, protocol_file: Path, profile, output: Path, exploratory: bool, quiet: bool, signer=None
) -> None:
    """Run a performance protocol, print each pair's ratio, the interval and the verdict; exit with its code."""
    from specval.preflight import SUTRaised

    kept = "is kept unsealed; a performance run is not resumed: start a new one"
    announced: list[Path] = []
    try:
        with execution.signals_interrupt():
            path, summary = given.kind.runner()(
                protocol_file,
                profile,
                output,
                exploratory=exploratory,
                progress=not quiet,
                parsed=given.load(),
                announce=_recording(announced, lambda p: click.echo(f"bundle: {p}")),
            )
    except (protocols.ProtocolError, bundles.BundleError) as err:
        _input_error(err)
    except SUTRaised as err:  # building the engines, before any bundle
        _fail_with(execution.EXIT_SUT, f"error: {err}; no bundle was started")
    except execution.RunFailed as err:
        _fail_with(execution.EXIT_SUT, f"error: {err}; traceback in {err.log}; the bundle {err.path} {kept}")
    except execution.RunInterrupted as err:
        _fail_with(execution.EXIT_INTERRUPTED, f"interrupted; the bundle {err.path} {kept}")
    except KeyboardInterrupt:
        _fail_with(execution.EXIT_INTERRUPTED, "interrupted; no bundle was started")
    except (execution.EnvironmentFailed, OSError, SystemExit, seeds.LedgerError) as err:
        _no_verdict(err, announced, lambda path: f"; the bundle {path} {kept}" if path else NOT_ANNOUNCED)
    _print_bench(summary, path)
    _sign_sealed(path, signer)
    sys.exit(execution.verdict_exit(summary["verdict"]))


def _print_bench(summary: dict, path: Path) -> None:
    proto, ratio = summary["protocol"], summary["ratio"]
    click.echo(
        f"{proto['statistic']} ratio b / a per pair ({summary['arms']['a']['name']} = a, "
        f"{summary['arms']['b']['name']} = b):"
    )
    for pair in summary["pairs"]:
        click.echo(
            f"  pair {pair['pair']:>3} {pair['order']}: a {pair['a']:.6g}  b {pair['b']:.6g}  ratio {pair['ratio']:.4f}"
        )
    click.echo(
        f"median ratio {ratio['median']:.4f}, exact order-statistic interval [{ratio['low']:.4f}, "
        f"{ratio['high']:.4f}] (coverage {ratio['coverage']:.4f} >= {ratio['confidence']:g}); "
        f"{proto['hypothesis']} threshold {summary['threshold']:.4f}"
    )
    marker = "EXPLORATORY " if summary.get("registration", {}).get("exploratory") else ""
    click.echo(f"{marker}{summary['verdict']}: {summary['reason']}")
    click.echo(f"bundle: {path}")


@main.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--profile", default=None, help="Scale profile of the protocol (e.g. ci, full).")
@click.option(
    "--output",
    default=Path("results"),
    type=click.Path(path_type=Path),
    show_default=True,
    help="Root directory of bundles.",
)
@click.option(
    "--exploratory",
    is_flag=True,
    help="Run a protocol that is not frozen in frozen.lock, or changed since; the verdict says EXPLORATORY.",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def bench(protocol_file, profile, output, exploratory, quiet) -> None:
    """Time the two arms of a performance protocol (kind: performance) in ABBA order: two engine
    configurations, or two groups of another adapter.

    Exit status: 0 PASS, 1 FAIL, 2 input or usage error, 3 the engine raised or exited, 4 INCONCLUSIVE,
    5 environment error (disk full, permissions...), 130 interrupted. `specval run` on a performance
    protocol does the same."""
    given = _read(protocol_file)
    if _kind(given).name != PERFORMANCE_KIND:
        _input_error(f"{protocol_file}: kind: not a performance protocol (`kind: {PERFORMANCE_KIND}`); use specval run")
    _bench(given, protocol_file, profile, output, exploratory, quiet)


def _signer(key_file: Path | None):
    """The private key of --sign (None: none given); exit 2 naming the file if it is not one."""
    try:
        return None if key_file is None else signing.load_private_key(key_file)
    except signing.SigningError as err:
        _input_error(err)


def _sign_sealed(bundle: Path, signer) -> None:
    """Sign the sealed BUNDLE with `signer` (None: nothing to do). One line if it cannot be: exit 5
    when the operating system refused the write (disk full, permissions), 2 when the bundle is not
    sealed and intact; either way it stays sealed and unsigned."""
    if signer is None:
        return
    unsigned = f"the bundle {bundle} is sealed and unsigned; sign it with: specval sign {bundle} --key KEY"
    try:
        key = signing.sign_bundle(bundle, signer)
    except OSError as err:
        _fail_with(EXIT_ENVIRONMENT, f"error: environment: {execution.describe_os_error(err)}; {unsigned}")
    except bundles.SHAPE_ERRORS as err:  # SigningError and BundleError are ValueErrors
        _input_error(f"{bundle}: cannot sign ({err}); {unsigned}")
    click.echo(f"signed: {bundle / signing.SIGNATURE_FILE} (key {key})")


@main.command()
@click.argument("bundle", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--key",
    "key_file",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The signer's ed25519 public key (PEM): fail unless BUNDLE is signed by it and unchanged since.",
)
@click.option(
    "--protocol",
    "protocol_file",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Fail unless BUNDLE ran exactly this protocol, frozen in the lock beside it.",
)
@click.option("--protocol-hash", default=None, help="Fail unless BUNDLE ran the frozen protocol of this hash.")
def verify(bundle, key_file, protocol_file, protocol_hash) -> None:
    """Re-hash every file of BUNDLE and recompute every verdict from its raw samples (a performance
    bundle: the ratios, the interval and the verdict from its recorded timings); check its
    signature (against --key, else the key it embeds) and, with --protocol or --protocol-hash,
    that it ran exactly that frozen protocol (`specval.api.verify`, the same checks).
    Exit 0 verifies, 1 differs, 2 bad input."""
    from specval import api

    if protocol_file is not None and protocol_hash is not None:
        raise click.UsageError("give --protocol or --protocol-hash, not both")
    if suite_directory(bundle):
        if protocol_file is not None or protocol_hash is not None:
            raise click.UsageError(
                "--protocol and --protocol-hash pin one bundle's protocol; a suite records "
                "each member's hash, checked against its bundle"
            )
        _verify_suite(bundle, _public_key(key_file))
    try:
        found = api.verify(bundle, key=key_file, protocol=protocol_file, protocol_hash=protocol_hash)
    except (signing.SigningError, protocols.ProtocolError, bundles.BundleError) as err:
        _input_error(err)
    for line in (*found.notes, found.signature):
        click.echo(line)
    for problem in found.differences:
        click.echo(f"DIFFERS {problem}")
    if not found.ok:
        click.echo(f"FAIL: {bundle} does not verify ({len(found.differences)} difference(s))")
        sys.exit(EXIT_FAIL)
    pinned_line = f"; ran the pinned frozen protocol {found.pinned[:12]}" if found.pinned else ""
    click.echo(f"OK: {bundle} verifies (checksums and recomputed verdicts match{pinned_line})")


def _public_key(key_file: Path | None):
    """The public key of --key (None: none given); exit 2 naming the file if it is not one."""
    try:
        return None if key_file is None else signing.load_public_key(key_file)
    except signing.SigningError as err:
        _input_error(err)


def _verify_suite(directory: Path, key) -> None:
    """Verify a suite's record and every member bundle (`specval.suite.verify`), each member's
    signature against `key` (None: the key it embeds, if signed); exit 0 or 1."""
    from specval import suite as suites

    problems = suites.verify(
        directory, lambda path: _bundle_kind(path).verify(path) + list(signing.check_signature(path, key).problems)
    )
    for problem in problems:
        click.echo(f"DIFFERS {problem}")
    if problems:
        click.echo(f"FAIL: suite {directory} does not verify ({len(problems)} difference(s))")
        sys.exit(EXIT_FAIL)
    click.echo(f"OK: suite {directory} verifies (every member bundle, and the verdicts and hashes it records)")
    sys.exit(EXIT_PASS)


@main.command()
@click.argument("bundle", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--key",
    "key_file",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The ed25519 private key (PEM, as `specval keygen` writes).",
)
def sign(bundle, key_file) -> None:
    """Sign the sealed BUNDLE (signature.dsse.json; an earlier signature is replaced) once it
    verifies. Exit 0 signed, 2 a bad key or a bundle that does not verify, 5 the operating system
    refused the signature's write (disk full, permissions)."""
    signer = _signer(key_file)
    problems = _bundle_kind(bundle).verify(bundle)
    if problems:
        _input_error(
            f"{bundle}: does not verify ({len(problems)} difference(s), first: {problems[0]}); refusing to sign"
        )
    _sign_sealed(bundle, signer)


@main.command()
@click.argument("key_file", type=click.Path(dir_okay=False, path_type=Path))
def keygen(key_file) -> None:
    """Write a new ed25519 key pair for `specval sign` / `run --sign`: KEY_FILE, the private key
    (mode 0600: keep it as a CI secret), and KEY_FILE.pub, the public key to publish."""
    try:
        public, key = signing.generate_key_pair(key_file)
    except signing.SigningError as err:
        _input_error(f"{key_file}: cannot write the key pair ({err})")
    except OSError as err:  # the operating system refused the write: an environment error, not input
        _fail_with(
            EXIT_ENVIRONMENT,
            f"error: environment: {key_file}: cannot write the key pair ({execution.describe_os_error(err)})",
        )
    click.echo(f"private key: {key_file} (keep it secret)")
    click.echo(f"public key: {public} (publish it)")
    click.echo(f"key id: {key}")


@main.command()
@click.argument("bundle", type=click.Path(file_okay=False, exists=True, path_type=Path))
def report(bundle) -> None:
    """Re-render report.md and report.html of BUNDLE and re-seal it (other files must be intact)."""
    kind = _bundle_kind(bundle)  # the same finish() contract for every kind
    problems = [p for p in bundles.check_sums(bundle) if p.split(":")[0] not in bundles.REPORT_FILES]
    if problems:
        _input_error(ValueError(f"{bundle} has changed files, refusing to re-seal: {'; '.join(problems)}"))
    try:
        kind.finish(bundle)
    except bundles.READ_ERRORS as err:
        _input_error(f"{bundle}: cannot render the report: {err}")
    click.echo(f"rendered {bundle / 'report.md'} and {bundle / 'report.html'}")


@main.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
def freeze(protocol_file) -> None:
    """Record PROTOCOL_FILE's canonical hash in the lock file next to it."""
    try:
        lock, digest = protocols.freeze(protocol_file, _load)
    except protocols.ProtocolError as err:
        _input_error(err)
    click.echo(f"frozen {protocol_file}: {digest} in {lock}")


@main.command(name="seeds")
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--profile", default=None)
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path), show_default=True)
def seeds_command(protocol_file, profile, output) -> None:
    """List the seed ranges held in the ledger and those the next run would take."""
    try:
        protocol = protocols.resolve(protocols.load_protocol(protocol_file), profile)
        ledger = seeds.read_ledger(output)
    except (protocols.ProtocolError, ValueError) as err:
        _input_error(err)
    held = [r for r in ledger if r.protocol == protocol.name]
    for r in held:
        click.echo(f"held  {r.run:<40} {r.group:<12} [{r.start}, {r.stop})")
    nxt = seeds.allocate(
        ledger, protocol.name, "next", [g.name for g in protocol.groups], protocol.samples_per_group, protocol.seed_base
    )
    for r in nxt:
        click.echo(f"next  {'(next run)':<40} {r.group:<12} [{r.start}, {r.stop})")


@main.command(name="ls")
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path), show_default=True)
def ls_command(output) -> None:
    """List the bundles under --output with their verdicts."""
    for path in sorted(p for p in Path(output).glob("*") if (p / bundles.RUN_FILE).exists()):
        sealed = "sealed" if (path / bundles.SUMS_FILE).exists() else "unsealed"
        state = _listed_state(path, sealed == "sealed")
        marked = f"EXPLORATORY {state}" if _listed_exploratory(path) else state
        click.echo(f"{marked:<{LS_STATE_WIDTH}} {sealed:<9} {path}")


LS_STATE_WIDTH = len("EXPLORATORY INCONCLUSIVE")  # the widest state `ls` prints


def _listed_exploratory(path: Path) -> bool:
    """True iff the bundle's run.json records an exploratory run (an unreadable one: False; its
    state then says what is wrong)."""
    try:
        return bundles.read_json(path / bundles.RUN_FILE).get("exploratory") is True
    except (bundles.BundleError, *bundles.READ_ERRORS):
        return False


def _listed_state(path: Path, sealed: bool) -> str:
    """The verdict of a bundle for `ls`: its summary's, ERROR (the SUT raised, not yet resumed),
    INCOMPLETE (no summary yet) or CORRUPT (a summary that cannot be read)."""
    summary_file = path / bundles.SUMMARY_FILE
    if not summary_file.exists():
        return "ERROR" if (path / execution.ERROR_LOG).exists() and not sealed else "INCOMPLETE"
    try:
        verdict = json.loads(summary_file.read_text())["verdict"]
    except (OSError, ValueError, KeyError, TypeError):
        return "CORRUPT"
    return verdict if isinstance(verdict, str) else "CORRUPT"


@main.command()
@click.argument("protocol_files", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path))
def validate(protocol_files) -> None:
    """Parse each protocol (all profiles) and print its canonical hash and frozen state; exit 1 if
    any protocol changed since it was frozen, 2 if any does not parse."""
    changed = []
    for path in protocol_files:
        try:
            protocol = _load(path)
            for name, _ in protocol.profiles:
                protocols.resolve(protocol, name)
            state = protocols.registration(protocol, path)
        except protocols.ProtocolError as err:
            _input_error(err)
        if state == protocols.CHANGED:
            changed.append(str(path))
        click.echo(
            f"{'CHANGED' if state == protocols.CHANGED else 'ok'} {path}: {protocol.name} {protocol.hash} ({state})"
        )
    if changed:
        click.echo(f"FAIL: {len(changed)} protocol(s) changed since frozen: {', '.join(changed)}")
        sys.exit(EXIT_FAIL)


@main.command()
@click.argument("protocol_paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--profile", default="ci", show_default=True, help="Scale profile of every mutant run.")
@click.option(
    "--output",
    default=Path("results"),
    type=click.Path(file_okay=False, path_type=Path),
    show_default=True,
    help="Root under which the mutate directory (bundles, kill table) is made.",
)
@click.option(
    "--mutant",
    "names",
    multiple=True,
    help="Only these mutants of the suite's adapter (repeatable; default: all it lists).",
)
@click.option(
    "--samples",
    default=None,
    type=click.IntRange(min=1),
    help="Samples per group instead of the profile's (reduced runs, e.g. in tests).",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Mutants run in this many processes (the table's rows keep their order).",
)
def mutate(protocol_paths, profile, output, names, samples, workers) -> None:
    """Run a protocol suite (PROTOCOL_PATHS: files, or directories of *.yaml, all with one adapter)
    against every planted bug the adapter lists (`Capabilities.mutants`) and the harness's seed
    collision, and write the kill table (exit 0 iff every mutant behaves as targeted: equivalent ones
    pass every protocol, every other one is killed by one, or its exact TV lies below the t1 MDEs)."""
    from specval.distribution import mutate as mutation

    try:
        root, table = mutation.mutate(
            tuple(protocol_paths), profile, output, tuple(names), samples, " ".join(bundles.invocation()), workers
        )
    except (protocols.ProtocolError, ValueError) as err:
        _input_error(err)
    click.echo((root / mutation.KILL_TABLE_MD).read_text())
    click.echo(f"kill table: {root / mutation.KILL_TABLE_JSON}")
    sys.exit(EXIT_PASS if all(row["as_expected"] for row in table) else EXIT_FAIL)


@main.command(name="check-adapter")
@click.argument("adapter")
@click.option(
    "--protocol",
    "protocol_file",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Take the sut settings, prompt, sampling, groups and K from this protocol (nothing is run).",
)
@click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="A sut.options entry for the adapter's constructor (VALUE read as YAML; repeatable).",
)
@click.option(
    "--num-speculative-tokens",
    "-k",
    default=None,
    type=click.IntRange(min=1),
    help="K given to the constructor (default: the protocol's, else 2).",
)
def check_adapter(adapter, protocol_file, options, num_speculative_tokens) -> None:
    """Exercise ADAPTER ("package.module:Class" or an entry point name) the way a run does, without
    a protocol run, and print what to fix: contract shapes and dtypes, token ranges and counts,
    seeded reproducibility, batch independence, distinct seeds, cache-free target logits, a coarse
    exact quadrature, vectorised accept_single, speed, describe().

    Exit status: 0 nothing to fix (advice may be printed), 1 something to fix, 2 the adapter cannot
    be loaded or constructed, or a bad --protocol / --option."""
    import dataclasses

    from specval import adapter_check as checks
    from specval.sut import SUTError

    try:
        extra = _options(options)
        k = num_speculative_tokens
        if protocol_file is not None:
            protocol = checks.with_adapter(protocols.load_protocol(protocol_file), adapter, extra)
            protocol = protocol if k is None else dataclasses.replace(protocol, num_speculative_tokens=k)
        else:
            protocol = checks.check_protocol(adapter, extra, k or checks.DEFAULT_SPECULATIVE_TOKENS)
        findings = checks.run_checks(protocol)
    except (protocols.ProtocolError, checks.CannotLoad, SUTError) as err:
        _input_error(f"cannot load adapter {adapter!r}: {err}" if not isinstance(err, protocols.ProtocolError) else err)
    except SystemExit as err:  # adapter code called sys.exit (on import, say): never its status, 0 would read OK
        _input_error(f"cannot load adapter {adapter!r}: its code raised SystemExit({err.code!r})")
    for finding in findings:
        click.echo(finding.line())
    fixes = [f for f in findings if f.level == checks.FIX]
    advice = sum(f.level == checks.ADVICE for f in findings)
    click.echo(
        f"{'FIX' if fixes else 'OK'}: {adapter}: {len(fixes)} to fix, {advice} advice, "
        f"{len(findings) - len(fixes) - advice} ok (docs/harness.md section 8)"
    )
    sys.exit(EXIT_FAIL if fixes else EXIT_PASS)


def _options(pairs: tuple[str, ...]) -> dict:
    """--option KEY=VALUE pairs as sut.options (values read as YAML); ValueError naming a bad pair."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise protocols.ProtocolError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise protocols.ProtocolError(f"--option {pair!r}: the value is not YAML ({err})") from err
    return out


@main.command()
@click.option(
    "--tv",
    default=None,
    type=click.FloatRange(0, 1, min_open=True),
    help="Target total-variation distance: print the samples needed.",
)
@click.option(
    "--n", "num_samples", default=None, type=click.IntRange(1, protocols.MAX_INT), help="Samples: print the MDE."
)
@click.option(
    "--bins",
    default=None,
    type=click.IntRange(2, protocols.MAX_INT),
    help="Cells of the test (default: the protocol's top_k).",
)
@click.option(
    "--alpha",
    default=None,
    type=click.FloatRange(protocols.MIN_ALPHA, protocols.MAX_ALPHA),
    help="Level (default: the protocol's, else 0.01).",
)
@click.option(
    "--power",
    default=None,
    type=click.FloatRange(protocols.MIN_POWER, protocols.MAX_POWER),
    help="Power (default: the protocol's, else 0.8).",
)
@click.option("--protocol", "protocol_file", default=None, type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--profile", default=None, help="Profile of --protocol whose samples per group are planned.")
@click.option(
    "--vocab-size",
    default=None,
    type=click.IntRange(min=2),
    help="Vocabulary size: bounds the cells of a --protocol without top_k.",
)
def plan(tv, num_samples, bins, alpha, power, protocol_file, profile, vocab_size) -> None:
    """Samples needed for a target TV (--tv), or the MDE of a sample size (--n), or every criterion of
    a protocol (--protocol) at its Holm level and confirmation rule."""
    from specval.distribution import plan as planning

    try:
        if protocol_file and _print_sequence_plan(protocol_file, profile):
            return
        protocol = protocols.resolve(protocols.load_protocol(protocol_file), profile) if protocol_file else None
        if protocol is not None and tv is None and num_samples is None:
            _print_protocol_plan(protocol, planning.protocol_plan(protocol, vocab_size))
            return
        alpha = alpha if alpha is not None else (protocol.alpha if protocol else 0.01)
        power = power if power is not None else (protocol.power if protocol else 0.8)
        if bins is None:
            if protocol is None:
                raise ValueError("--bins is required without --protocol")
            bins = planning.protocol_bins(protocol, vocab_size)
        if tv is not None:
            result = planning.samples_for(tv, bins, alpha, power)
            click.echo(
                f"TV >= {tv:g} over {bins} cells at alpha {alpha:g}, power {power:g}: "
                f"{result.samples_gof} samples (goodness of fit), "
                f"{result.samples_per_group_homogeneity} per group (homogeneity)"
            )
            return
        n = num_samples
        if n is None:
            raise ValueError("give --tv, --n or --protocol")
        result = planning.mde_for(n, bins, alpha, power)
    except (protocols.ProtocolError, ValueError) as err:
        _input_error(err)
    click.echo(
        f"n = {n} over {bins} cells at alpha {alpha:g}: deviations of TV >= {result.mde_gof:.4g} "
        f"(goodness of fit) or >= {result.mde_homogeneity:.4g} (homogeneity, two groups of n) would "
        f"have been detected with power >= {power:g}"
    )


def _print_sequence_plan(protocol_file: Path, profile: str | None) -> bool:
    """Print the plan of a sequence protocol and return True; False for a protocol of another kind."""
    from specval.kinds import read_protocol_file
    from specval.sequence.plan import protocol_plan
    from specval.sequence.protocol import SEQUENCE_KIND, resolve

    loaded = read_protocol_file(protocol_file)
    if loaded.kind.name != SEQUENCE_KIND:
        return False
    protocol = resolve(loaded.load(), profile)
    click.echo(
        f"{protocol.name} ({protocol.profile or 'default'}): {protocol.sequences_per_group} sequences of "
        f"{protocol.sequence_length} tokens per group, alpha {protocol.alpha:g}, power {protocol.power:g}"
    )
    for row in protocol_plan(protocol):
        mde = f">= {row.mde:.4g}" if row.mde is not None else ""
        click.echo(
            f"  {row.criterion} ({row.role}, m = {row.family_size}, level {row.level:.3g}, n = {row.n}): "
            f"{row.label} {mde}".rstrip()
        )
    return True


def _print_protocol_plan(protocol, rows) -> None:
    from specval.distribution import looks

    stages = "two-stage confirmation" if protocol.confirmation.is_two_stage else "one stage"
    if protocol.sequential is not None:
        sizes = looks.schedule(protocol, protocol.alpha)
        stages += (
            f", {protocol.sequential.spending} looks at {', '.join(str(x.samples_per_group) for x in sizes)} "
            f"samples per group (levels below: the last look's)"
        )
    click.echo(
        f"{protocol.name} ({protocol.profile or 'default'}): {protocol.samples_per_group} samples per group, "
        f"alpha {protocol.alpha:g}, power {protocol.power:g}, {stages}"
    )
    for row in rows:
        levels = ", ".join(f"{level:.3g}" for level in row.levels)
        click.echo(
            f"  {row.criterion} ({row.role}, m = {row.family_size}, level {levels}, df <= {row.df_bound}): "
            f"{row.label} >= {row.mde_tv:.4g}"
        )


@main.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--replicates", default=200, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--samples",
    default=None,
    type=click.IntRange(min=1),
    help="Samples per group of each replicate (default: the profile's samples_per_group).",
)
@click.option("--profile", default=None)
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path), show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option(
    "--resume",
    default=None,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Continue a killed calibration in its bundle (same protocol, replicates, samples).",
)
@click.option(
    "--exact",
    is_flag=True,
    help="Draw every group straight from the float64 reference (calibrates the statistics alone).",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Processes sharing the replicates (with --exact: their sampling and evaluation; else their evaluation).",
)
def calibrate(protocol_file, replicates, samples, profile, output, quiet, resume, exact, workers) -> None:
    """A/A calibration: FAIL rate per criterion, per family and per run (95% CI) next to nominal."""
    from specval.distribution import calibrate as calibration
    from specval.sut import SUTError

    try:
        size = samples or protocols.resolve(protocols.load_protocol(protocol_file), profile).samples_per_group
        if exact:
            path, result = calibration.calibrate_exact_file(protocol_file, profile, output, replicates, size, workers)
        else:
            path, result = calibration.calibrate(
                protocol_file, profile, output, replicates, size, progress=not quiet, resume=resume, workers=workers
            )
    except (protocols.ProtocolError, seeds.SeedOverlapError, SUTError, ValueError) as err:
        _input_error(err)
    for name, row in list(result["criteria"].items()) + [(f"family {r}", f) for r, f in result["families"].items()]:
        ks = row.get("ks_uniformity")
        ks_text = f"; KS p = {ks['p_value']:.3g}" if ks else ""
        low, high = row["rate_ci95"]
        click.echo(
            f"  {name}: {row['failures']}/{result['replicates']} FAIL = {row['rate']:.4f} "
            f"[{low:.4f}, {high:.4f}] vs nominal {row.get('nominal', row.get('alpha'))}{ks_text}"
        )
    run = result["run"]
    click.echo(
        f"run: {run['failures']}/{result['replicates']} FAIL = {run['rate']:.4f} "
        f"[{run['rate_ci95'][0]:.4f}, {run['rate_ci95'][1]:.4f}] vs bound {run['bound']:.3g}"
    )
    for look in result.get("sequential", {}).get("looks", []):
        click.echo(
            f"look {look['look']} ({look['samples_per_group']} per group, level {look['level']:.3g}): "
            f"{look['stopped']}/{result['replicates']} stopped here, {look['failures']} with FAIL"
        )
    click.echo(f"calibration: {path}")


if __name__ == "__main__":  # pragma: no cover
    main()
