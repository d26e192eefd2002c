"""The commands over bundles already written: `verify` (a bundle, or a suite's record and every
member bundle), `report` (re-render and re-seal) and `ls` (the bundles under --output with their
verdicts).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specval import bundle as bundles
from specval import execution, signing
from specval import protocol as protocols
from specval.cli.common import (
    EXIT_ENVIRONMENT,
    EXIT_FAIL,
    EXIT_PASS,
    bundle_kind_of,
    fail_with,
    input_error,
    public_key_of,
)
from specval.identity import DIGEST_PATTERN, pinned_digest_problem
from specval.suite import is_suite_directory as suite_directory


@click.command()
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
@click.option(
    "--profile", default=None, help="Fail unless BUNDLE ran this profile of its protocol (run.json's `profile`)."
)
@click.option(
    "--sut-digest",
    default=None,
    callback=lambda ctx, param, value: _digest_option(value),
    help="Fail unless BUNDLE's system under test has this SHA-256 digest (manifest.json's "
    "sut_identity.digest, on the report's first screen); a suite: every member.",
)
def verify(bundle, key_file, protocol_file, protocol_hash, profile, sut_digest) -> None:
    """Re-hash every file of BUNDLE and recompute every verdict from its raw samples (a performance
    bundle: the ratios, the interval and the verdict from its recorded timings); check its
    signature (against --key, else the key it embeds) and, with --protocol or --protocol-hash,
    that it ran exactly that frozen protocol (`specval.api.verify`, the same checks); with
    --sut-digest, that it tested the system under test of that digest (a bundle that records none
    fails); with --profile, that it ran that profile. With --key the signature is checked first:
    a bundle it does not cover fails before any other file is parsed. Sample chunks over the
    bounds of `specval.bundle.samples` fail from their footers, before any sample is decoded.
    Exit 0 verifies, 1 differs, 2 bad input."""
    from specval import api

    if protocol_file is not None and protocol_hash is not None:
        raise click.UsageError("give --protocol or --protocol-hash, not both")
    if suite_directory(bundle):
        if protocol_file is not None or protocol_hash is not None or profile is not None:
            raise click.UsageError(
                "--protocol, --protocol-hash and --profile pin one bundle's protocol; a suite records "
                "each member's hash, checked against its bundle"
            )
        _verify_suite(bundle, public_key_of(key_file), sut_digest)
    if key_file is not None:
        _signature_first(bundle, public_key_of(key_file), protocol_file, protocol_hash)
    try:
        found = api.verify(bundle, key=key_file, protocol=protocol_file, protocol_hash=protocol_hash)
    except (signing.SigningError, protocols.ProtocolError, bundles.BundleError) as err:
        input_error(err)
    for line in (*found.notes, found.signature):
        click.echo(line)
    for problem in found.differences:
        click.echo(f"DIFFERS {problem}")
    if not found.ok:
        click.echo(f"FAIL: {bundle} does not verify ({len(found.differences)} difference(s))")
        sys.exit(EXIT_FAIL)
    pin_problem = _sut_problems(bundle, sut_digest) + (bundles.check_profile(bundle, profile) if profile else [])
    if pin_problem:
        click.echo(f"FAIL: {bundle}: {pin_problem[0]}")
        sys.exit(EXIT_FAIL)
    pinned_line = _pinned_line(bundle, found.pinned, profile)
    sut_line = f"; tested the pinned system under test {sut_digest}" if sut_digest else ""
    click.echo(f"OK: {bundle} verifies (checksums and recomputed verdicts match{pinned_line}{sut_line})")


def _signature_first(bundle: Path, key, protocol_file: Path | None, protocol_hash: str | None) -> None:
    """Exit 1 (printing the signature line, each problem and FAIL) unless BUNDLE's signature
    holds under `key` over every file: checked before any other file of the bundle is parsed, so
    a file changed after signing (a huge parquet, a hostile JSON) is never read beyond its hash.
    Reads the envelope and sessions.json (both bounded JSON) and hashes every regular file. Bad
    input is told first (exit 2): a pinned protocol that cannot be pinned, a directory that is no
    bundle."""
    from specval import api

    try:
        api.pinned_hash(protocol_file, protocol_hash)
    except (protocols.ProtocolError, ValueError) as err:
        input_error(err)
    if not (bundle / bundles.RUN_FILE).is_file():
        input_error(bundles.BundleError(f"{bundle}: not a bundle ({bundles.RUN_FILE} missing)"))
    check = signing.check_signature(bundle, key)
    if not check.problems:
        return
    click.echo(check.line)
    for problem in check.problems:
        click.echo(f"DIFFERS {problem}")
    click.echo(f"FAIL: {bundle} does not verify (the signature does not cover it; nothing else was read)")
    sys.exit(EXIT_FAIL)


def _pinned_line(bundle: Path, pinned: str | None, profile: str | None) -> str:
    """The OK line's words on what was pinned: the frozen protocol with the profile it ran, and a
    pinned profile."""
    if not pinned and not profile:
        return ""
    try:
        ran = bundles.ran_profile(bundle)
    except (bundles.BundleError, *bundles.READ_ERRORS):
        ran = None  # verify has read run.json already: not reached for a bundle that verified
    shown = f"profile {ran!r}" if ran else "its default profile"
    if not pinned:
        return f"; ran the pinned {shown}"
    return f"; ran the pinned frozen protocol {pinned[:12]}, {'the pinned ' if profile else ''}{shown}"


def _digest_option(value: str | None) -> str | None:
    """--sut-digest in lowercase; BadParameter (exit 2) unless it is a whole SHA-256 in hex."""
    if value is None:
        return None
    digest = value.strip().lower()
    if not DIGEST_PATTERN.match(digest):
        raise click.BadParameter(f"{value!r} is not a SHA-256 digest (64 hex digits)", param_hint="--sut-digest")
    return digest


def _sut_problems(bundle: Path, expected: str | None) -> list[str]:
    """[the problem] when BUNDLE's recorded system under test is not `expected` (None: not pinned)."""
    if expected is None:
        return []
    try:
        manifest = bundles.read_typed(bundle / bundles.MANIFEST_FILE, dict)
    except (bundles.BundleError, *bundles.READ_ERRORS) as err:
        return [f"cannot read the system under test's identity: {err}"]
    problem = pinned_digest_problem(manifest, expected)
    return [problem] if problem else []


def _verify_suite(directory: Path, key, sut_digest: str | None = None) -> None:
    """Verify a suite's record and every member bundle (`specval.suite.verify`), each member's
    signature against `key` (None: the key it embeds, if signed) and, with `sut_digest`, its
    system under test; exit 0 or 1."""
    from specval import suite as suites

    problems = suites.verify(
        directory,
        lambda path: (
            bundle_kind_of(path).verify(path)
            + list(signing.check_signature(path, key).problems)
            + _sut_problems(path, sut_digest)
        ),
    )
    for problem in problems:
        click.echo(f"DIFFERS {problem}")
    if problems:
        click.echo(f"FAIL: suite {directory} does not verify ({len(problems)} difference(s))")
        sys.exit(EXIT_FAIL)
    click.echo(f"OK: suite {directory} verifies (every member bundle, and the verdicts and hashes it records)")
    sys.exit(EXIT_PASS)


@click.command()
@click.argument("bundle", type=click.Path(file_okay=False, exists=True, path_type=Path))
def report(bundle) -> None:
    """Re-render report.md and report.html of BUNDLE and re-seal it (other files must be intact,
    sample chunks within the bounds of `specval.bundle.samples`). Exit 0 rendered, 2 a bundle that
    changed, is over a bound or cannot be rendered, 5 the operating system refused
    a write (a read-only bundle, a full disk)."""
    kind = bundle_kind_of(bundle)  # the same finish() contract for every kind
    problems = [p for p in bundles.check_sums(bundle) if p.split(":")[0] not in bundles.REPORT_FILES]
    if problems:
        input_error(ValueError(f"{bundle} has changed files, refusing to re-seal: {'; '.join(problems)}"))
    over = bundles.check_sample_bounds(bundle)  # from the footers: no sample is decoded
    if over:
        input_error(ValueError(f"{bundle}: refusing to render: {over[0]}"))
    try:
        kind.finish(bundle)
    except OSError as err:  # a read-only bundle, a full disk: the environment's, as documented
        fail_with(EXIT_ENVIRONMENT, f"error: environment: {execution.describe_os_error(err)}")
    except bundles.READ_ERRORS as err:
        input_error(f"{bundle}: cannot render the report: {err}")
    click.echo(f"rendered {bundle / 'report.md'} and {bundle / 'report.html'}")


@click.command(name="ls")
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
        verdict = bundles.read_typed(summary_file, dict)["verdict"]  # bounded: a hostile summary is CORRUPT
    except bundles.READ_ERRORS:
        return "CORRUPT"
    return verdict if isinstance(verdict, str) else "CORRUPT"
