"""The signing commands: `sign` (a sealed bundle that verifies) and `keygen` (an ed25519 key
pair). `run --sign` and `verify --key` reach the same keys through `specval.cli.common`.
"""

from __future__ import annotations

from pathlib import Path

import click

from specval import bundle as bundles
from specval import execution, signing
from specval.cli.common import EXIT_ENVIRONMENT, bundle_kind_of, fail_with, input_error, sign_sealed, signer_of


@click.command()
@click.argument("bundle", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--key",
    "key_file",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The ed25519 private key (PEM, as `specval keygen` writes).",
)
def sign(bundle, key_file) -> None:
    """Sign the sealed BUNDLE (signature.dsse.json; an earlier signature is replaced) once every
    file but its report verifies: the report is re-rendered naming the signer's key id and the
    bundle re-sealed, then signed (as `run --sign` does). Exit 0 signed, 2 a bad key or a bundle
    that does not verify, 5 the operating system refused a write (disk full, permissions)."""
    signer = signer_of(key_file)
    problems = [p for p in bundle_kind_of(bundle).verify(bundle) if p.split(":")[0] not in bundles.REPORT_FILES]
    if problems:
        input_error(
            f"{bundle}: does not verify ({len(problems)} difference(s), first: {problems[0]}); refusing to sign"
        )
    sign_sealed(bundle, signer)


@click.command()
@click.argument("key_file", type=click.Path(dir_okay=False, path_type=Path))
def keygen(key_file) -> None:
    """Write a new ed25519 key pair for `specval sign` / `run --sign`: KEY_FILE, the private key
    (mode 0600: keep it as a CI secret), and KEY_FILE.pub, the public key to publish."""
    try:
        public, key = signing.generate_key_pair(key_file)
    except signing.SigningError as err:
        input_error(f"{key_file}: cannot write the key pair ({err})")
    except OSError as err:  # the operating system refused the write: an environment error, not input
        fail_with(
            EXIT_ENVIRONMENT,
            f"error: environment: {key_file}: cannot write the key pair ({execution.describe_os_error(err)})",
        )
    click.echo(f"private key: {key_file} (keep it secret)")
    click.echo(f"public key: {public} (publish it)")
    click.echo(f"key id: {key}")
