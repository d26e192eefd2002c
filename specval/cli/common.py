"""What the commands of `specval` share: the exit statuses and the one-line errors that end a
command with them, the group class that maps an interrupt (130) or an OSError no command handled
(5), reading a protocol file or a bundle's kind, the option checks of `run`, and the keys of
--sign and --key.

Every command module imports this one; it imports none of them.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from pathlib import Path

import click

from specval import bundle as bundles
from specval import channel, execution, lifecycle, seeds, signing
from specval import protocol as protocols
from specval.kinds import (
    DISTRIBUTION_KIND,
    KINDS,
    SEQUENCE_KIND,
    Kind,
    ProtocolFile,
    bundle_kind,
    read_protocol_file,
)

EXIT_PASS, EXIT_FAIL, EXIT_INPUT = execution.EXIT_PASS, execution.EXIT_FAIL, execution.EXIT_INPUT
EXIT_ENVIRONMENT = execution.EXIT_ENVIRONMENT
SHARDED_KINDS = (DISTRIBUTION_KIND, SEQUENCE_KIND)  # the kinds a multi-process run shares (sharding)


# ---------------------------------------------------------------- exits: one line, one status


def input_error(err: Exception | str) -> None:
    """Exit 2 with one line: a character that is not printable (a newline or a control character
    in a key of the file, say) is written as its escape."""
    click.echo(_printable(f"error: {err}"), err=True)
    sys.exit(EXIT_INPUT)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def fail_with(code: int, line: str) -> None:
    click.echo(line, err=True)
    sys.exit(code)


def kept(path: Path) -> str:
    return f"; the bundle {path} is kept; resume with: {execution.resume_command(path)}"


NOT_ANNOUNCED = "; no bundle was announced"


def interrupted(path: Path | None) -> None:
    fail_with(execution.EXIT_INTERRUPTED, f"interrupted{kept(path) if path else '; no bundle was started'}")


def no_verdict(err: BaseException, announced: list[Path], where: Callable[[Path | None], str]) -> None:
    """A run that ended without a verdict, with one line: exit 5 for an OSError of the harness
    (EnvironmentFailed or a bare OSError) or an unreadable seed ledger, 3 for a SystemExit of code
    the run called outside the guarded adapter calls (never its status: 0 would read as PASS).
    `where(path)` tells what became of the bundle (EnvironmentFailed's, else the announced one;
    None: none was announced)."""
    path = err.path if isinstance(err, execution.EnvironmentFailed) else (announced[0] if announced else None)
    if isinstance(err, SystemExit):
        fail_with(
            execution.EXIT_SUT, f"error: the run was ended by SystemExit({err.code!r}) before any verdict{where(path)}"
        )
    if isinstance(err, seeds.LedgerError):  # the output root's state, like a ledger.json that is a directory
        fail_with(EXIT_ENVIRONMENT, f"error: environment: {err}{where(path)}")
    cause = err.cause if isinstance(err, execution.EnvironmentFailed) else err
    fail_with(EXIT_ENVIRONMENT, f"error: environment: {execution.describe_os_error(cause)}{where(path)}")


def recording(announced: list[Path], announce: Callable[[Path], None]) -> Callable[[Path], None]:
    """`announce`, also appending the bundle's path to `announced` (what an error message names)
    and telling the supervisor (specval.channel: what it checks is sealed before it exits 0)."""

    def record(path: Path) -> None:
        announced.append(path)
        channel.report_bundle(path)
        announce(path)

    return record


class Cli(click.Group):
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


# ---------------------------------------------------------------- protocol files and bundles


def read(path: Path | None) -> ProtocolFile | None:
    """PATH's protocol file, read once (exit 2 naming the file if it is not YAML); None when there
    is no file to read (the runner reports that)."""
    if path is None or not path.is_file():
        return None
    try:
        return read_protocol_file(path)
    except protocols.ProtocolError as err:
        input_error(err)


def kind_of(source: ProtocolFile | None) -> Kind:
    """The kind of a protocol file read by `read`; the distribution kind for none."""
    return KINDS[DISTRIBUTION_KIND] if source is None else source.kind


def load(path: Path):
    """PATH's protocol, parsed by the parser of its kind (ProtocolError naming the file)."""
    return read_protocol_file(path).load()


def bundle_kind_of(bundle: Path) -> Kind:
    """The kind of the protocol BUNDLE ran; exit 2 naming the file unless BUNDLE is a bundle."""
    try:
        return bundle_kind(bundle)
    except bundles.BundleError as err:
        input_error(err)


# ---------------------------------------------------------------- option checks


RESUME_CONFLICTS = ("profile", "output", "seed_offset", "confirmatory", "exploratory")  # fixed by the bundle


def given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def check_run_flags(ctx: click.Context, protocol_file, resume, exploratory, confirmatory) -> None:
    if (protocol_file is None) == (resume is None):
        raise click.UsageError("give exactly one of PROTOCOL_FILE or --resume BUNDLE")
    if exploratory and confirmatory:
        raise click.UsageError("--exploratory and --confirmatory contradict each other")
    if resume is not None:
        conflicts = [f"--{name.replace('_', '-')}" for name in RESUME_CONFLICTS if given(ctx, name)]
        if conflicts:
            raise click.UsageError(
                f"--resume continues {resume} with the protocol, profile, seeds, output and "
                f"registration recorded in it; drop {', '.join(conflicts)}"
            )


def check_suite_flags(ctx: click.Context) -> None:
    """`run` of a suite: refuse the options that apply to one bundle."""
    for name in ("seed_offset",):
        if given(ctx, name):
            raise click.UsageError(f"--{name.replace('_', '-')} does not apply to a suite (it applies to one bundle)")


def check_performance_flags(ctx: click.Context) -> None:
    """`run` of a performance protocol: refuse the options of a sampled run."""
    for name in ("seed_offset", "junit"):
        if given(ctx, name):
            raise click.UsageError(f"--{name.replace('_', '-')} does not apply to a performance protocol")


def check_sharded(protocol_file: Path, kind: Kind, devices: int, shards) -> None:
    """Refusals of a multi-rank run of `protocol_file` (the bundle's copy for --resume) of `kind`,
    made by every rank before any rank joins the group (exit 2)."""
    if devices > 1 and shards is not None:
        raise click.UsageError("--devices launches torchrun; inside a torchrun-started process drop it")
    if kind.name not in SHARDED_KINDS:
        raise click.UsageError(
            f"multi-process runs take {' and '.join(SHARDED_KINDS)} protocols only, not kind: {kind.name}"
        )
    if devices > 1:
        _check_gpus(protocol_file, devices)


def _check_gpus(protocol_file: Path, devices: int) -> None:
    """--devices N of a CUDA protocol needs N GPUs (rank r runs on cuda:r)."""
    from specval.distribution import sharding

    if sharding.protocol_device(protocol_file).startswith(sharding.CUDA_PREFIX):
        try:
            sharding.require_torch()
        except sharding.TorchMissing as err:
            input_error(str(err))
        import torch

        if torch.cuda.device_count() < devices:
            raise click.UsageError(
                f"--devices {devices}: {protocol_file} runs on CUDA and this host has "
                f"{torch.cuda.device_count()} GPU(s)"
            )


# ---------------------------------------------------------------- keys of --sign and --key


def signer_of(key_file: Path | None):
    """The private key of --sign (None: none given); exit 2 naming the file if it is not one."""
    try:
        return None if key_file is None else signing.load_private_key(key_file)
    except signing.SigningError as err:
        input_error(err)


def public_key_of(key_file: Path | None):
    """The public key of --key (None: none given); exit 2 naming the file if it is not one."""
    try:
        return None if key_file is None else signing.load_public_key(key_file)
    except signing.SigningError as err:
        input_error(err)


def sign_sealed(bundle: Path, signer) -> None:
    """Sign the sealed BUNDLE with `signer` (None: nothing to do): its report re-rendered naming
    the signer's key id (`specval.report.signer`), the bundle re-sealed, then the signature
    written over every file, the report included. One line if it cannot be: exit 5 when the
    operating system refused a write (disk full, permissions), 2 when the bundle is not sealed and
    intact; either way it is unsigned, and `specval sign` (which re-renders the report) signs it."""
    if signer is None:
        return
    unsigned = f"the bundle {bundle} is sealed and unsigned; sign it with: specval sign {bundle} --key KEY"
    try:
        _name_signer(bundle, signing.key_id(signer.public_key()))
        key = signing.sign_bundle(bundle, signer)
    except OSError as err:
        fail_with(EXIT_ENVIRONMENT, f"error: environment: {execution.describe_os_error(err)}; {unsigned}")
    except bundles.SHAPE_ERRORS as err:  # SigningError and BundleError are ValueErrors
        input_error(f"{bundle}: cannot sign ({err}); {unsigned}")
    click.echo(f"signed: {bundle / signing.SIGNATURE_FILE} (key {key})")


def _name_signer(bundle: Path, key: str) -> None:
    """Re-render BUNDLE's report from its files naming the signer of key id `key` (a bundle made
    before identities names none: its report re-renders as sealed), and re-seal it: the signature
    written next covers a report that names its own key."""
    bundles.write_files(bundle, bundle_kind(bundle).render(bundle, key))
    lifecycle.seal(bundle)
