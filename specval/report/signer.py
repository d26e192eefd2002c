"""The signer line of a report's first screen: the key that signed the bundle and what its
signature covers, or that nobody signed it.

The signature covers the report, so the report cannot name the signature's bytes; it names what
is known before signing, the key id (the SHA-256 of the raw ed25519 public key, `signing.key_id`).
A signer re-renders the report with its key id (`signer`), re-seals, then signs; every later
rendering reads the key id from signature.dsse.json.

Guarantees: the line is a function of the bundle's files (the envelope's `keyid`, or its absence)
and of nothing else but `signer`, so `specval verify` re-renders a signed report byte for byte,
and a report whose signature was removed, replaced under another key, or added without
re-rendering differs from its re-rendering. Only bundles that record the system under test's
identity (`markdown.has_identity`) get the line: older bundles render as they were sealed.
Reading the envelope never raises: an unreadable one gives UNREADABLE_TEXT (verify names the fault).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from specval import bundle as bundles
from specval.report.markdown import has_identity

KEY_ID_PATTERN = re.compile(r"^[0-9a-f]{64}$")  # a key id: SHA-256 in lowercase hex
SIGNED_TEXT = (
    "signed by key {key_id} (ed25519; the key id is the SHA-256 of the public key): "
    f"{bundles.SIGNATURE_FILE} signs every other file of this bundle, this report included; check it "
    "against the key its signer publishes with: specval verify BUNDLE --key PUBLIC_KEY"
)
UNSIGNED_TEXT = (
    "unsigned: nothing says who made this bundle; specval verify checks its internal consistency "
    "only (specval sign BUNDLE --key KEY signs it)"
)
UNREADABLE_TEXT = f"signature: {bundles.SIGNATURE_FILE} names no key id that can be read (specval verify says why)"


def signed_text(key_id: str) -> str:
    """The line of a bundle signed by the key of id `key_id`."""
    return SIGNED_TEXT.format(key_id=key_id)


def envelope_key_id(path: Path) -> str | None:
    """The key id signature.dsse.json of the bundle at `path` names (its one signature's `keyid`);
    None when the bundle holds no envelope. ValueError when the envelope cannot be read or names
    no key id in lowercase hex; whether the signature holds is `signing.check_signature`'s."""
    envelope = path / bundles.SIGNATURE_FILE
    if not os.path.lexists(envelope):
        return None
    try:
        (signature,) = bundles.read_typed(envelope, dict)["signatures"]
        key_id = signature["keyid"]
    except bundles.READ_ERRORS as err:
        raise ValueError(f"{envelope}: no key id ({err})") from err
    if not isinstance(key_id, str) or not KEY_ID_PATTERN.match(key_id):
        raise ValueError(f"{envelope}: keyid {key_id!r} is not a SHA-256 in lowercase hex")
    return key_id


def signer_text(path: Path, signer: str | None = None) -> str:
    """The signer line of the bundle at `path`: signed by `signer` (a key id, given by the process
    about to sign), else by the key its envelope names, else unsigned."""
    if signer is not None:
        return signed_text(signer)
    try:
        key_id = envelope_key_id(path)
    except ValueError:
        return UNREADABLE_TEXT
    return UNSIGNED_TEXT if key_id is None else signed_text(key_id)


def signer_lines(path: Path, manifest: dict, signer: str | None = None) -> list[str]:
    """[`signer_text`] for a bundle that records the system under test's identity; [] for one made
    before it (its report renders as sealed)."""
    return [signer_text(path, signer)] if names_signer(manifest) else []


def names_signer(manifest: dict) -> bool:
    """True iff the report of the bundle of this manifest names its signer (`signer_lines`)."""
    return has_identity(manifest)
