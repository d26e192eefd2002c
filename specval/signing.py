"""Signing: an ed25519 signature over a sealed bundle, as an in-toto Statement in a DSSE envelope.

`signature.dsse.json`, beside SHA256SUMS (neither lists the other; every other file is a subject):

    {"payloadType": "application/vnd.in-toto+json", "payload": base64(Statement),
     "signatures": [{"keyid": K, "sig": base64(ed25519(PAE(payloadType, Statement)))}]}

    Statement = {"_type": "https://in-toto.io/Statement/v1",
                 "subject": [{"name": <file>, "digest": {"sha256": <hex>}}, ...],   every file, SHA256SUMS too
                 "predicateType": PREDICATE_TYPE,
                 "predicate": {"protocol": {name, hash, profile, registration, exploratory},
                               "lock": run.json's lock, "chunk_heads", "code": {version, commit, dirty,
                               source_sha256, adapter}, "sut_identity": {name, version, digest,
                               commit, dirty, covers}, "packages", "python", "device",
                               "signer": {"keyid": K, "public_key": base64(raw 32 bytes)},
                               "signed": {"time", "specval"}}}

PAE is DSSE's pre-authentication encoding, `DSSEv1 <len> <type> <len> <body>`; K, the key id, is
the SHA-256 of the raw public key in hex. The predicate is copied from run.json and manifest.json.

Guarantees: `check_signature(bundle, key)` fails unless the envelope's signature verifies under
`key` (None: the public key the envelope embeds) and every file of the bundle has exactly the
sha256 of its subject, no subject missing and no file added: any byte changed after signing, a
re-seal included, fails. What it proves is the holder of the private key signed these bytes;
that the key is the team's, only `--key` with the team's published public key proves. The
envelope's `keyid` and the statement's signer `keyid` must be the id of the key that verifies (the
--key given, else the embedded one). A bundle whose sessions.json records a session run with
`--sign` fails without its envelope, with or without `key`: removing the signature does not make
it "unsigned".
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from specval import bundle as bundles
from specval.identity import IDENTITY_KEY
from specval.version import __version__

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNATURE_FILE = bundles.SIGNATURE_FILE
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "urn:specval:evidence-bundle:v1"
UNSIGNED_LINE = "unsigned: internal consistency only"
MISSING_LINE = "signature: missing, though a session signed"  # sessions.json records `--sign`, no envelope
SIGN_FLAG = "--sign"  # the option of `specval run` a session's recorded command asks for a signature with
PRIVATE_KEY_MODE = 0o600  # a private key file is readable by its owner only
PUBLIC_KEY_SUFFIX = ".pub"


class SigningError(ValueError):
    """A key that cannot be read or used, or a bundle that cannot be signed; names the file."""


@dataclass(frozen=True)
class SignatureCheck:
    """What `check_signature` found: `problems` (empty: the signature holds) and `line`, the
    sentence verify prints about who signed (or that nobody did)."""

    problems: tuple[str, ...]
    line: str


# ---------------------------------------------------------------- keys


@functools.cache
def _crypto() -> SimpleNamespace:
    """cryptography's ed25519 names, imported on first use: a run that neither signs nor checks a
    signature never imports the package (a missing one is then reported when it is needed)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return SimpleNamespace(
        InvalidSignature=InvalidSignature,
        serialization=serialization,
        Ed25519PrivateKey=ed25519.Ed25519PrivateKey,
        Ed25519PublicKey=ed25519.Ed25519PublicKey,
    )


def key_id(public_key: Ed25519PublicKey) -> str:
    """SHA-256 of the raw 32-byte public key, in hex: the name a team publishes with its key."""
    return hashlib.sha256(_raw(public_key)).hexdigest()


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(_crypto().serialization.Encoding.Raw, _crypto().serialization.PublicFormat.Raw)


def generate_key_pair(private_path: Path) -> tuple[Path, str]:
    """Write a new ed25519 private key to `private_path` (PEM, PKCS#8, mode 0600) and its public
    key to `<private_path>.pub` (PEM); returns (public key file, key id). Refuses (SigningError)
    to overwrite either file."""
    public_path = private_path.with_name(private_path.name + PUBLIC_KEY_SUFFIX)
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise SigningError(f"{path}: exists; a key file is never overwritten")
    serialization = _crypto().serialization
    key = _crypto().Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_KEY_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return public_path, key_id(key.public_key())


def _read_key_file(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise SigningError(f"{path}: cannot read the key ({err.strerror or err})") from err


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The ed25519 private key in the PEM file `path` (unencrypted PKCS#8, as `specval keygen` writes)."""
    try:
        key = _crypto().serialization.load_pem_private_key(_read_key_file(path), password=None)
    except (ValueError, TypeError) as err:
        raise SigningError(f"{path}: not an unencrypted PEM private key ({err})") from err
    if not isinstance(key, _crypto().Ed25519PrivateKey):
        raise SigningError(f"{path}: a {type(key).__name__}, not an ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The ed25519 public key in the PEM file `path` (`specval keygen`'s `.pub`)."""
    try:
        key = _crypto().serialization.load_pem_public_key(_read_key_file(path))
    except (ValueError, TypeError) as err:
        raise SigningError(f"{path}: not a PEM public key ({err})") from err
    if not isinstance(key, _crypto().Ed25519PublicKey):
        raise SigningError(f"{path}: a {type(key).__name__}, not an ed25519 public key")
    return key


# ---------------------------------------------------------------- the statement


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding of (payloadType, payload): the bytes that are signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def subjects(bundle: Path) -> dict[str, str]:
    """{file: sha256} of every regular file of the bundle but the envelope, SHA256SUMS included."""
    names = [name for name in bundles.regular_files(bundle) if name != SIGNATURE_FILE]
    return {name: bundles.sha256_file(bundle / name) for name in names}


def predicate(bundle: Path, public_key: Ed25519PublicKey) -> dict[str, Any]:
    """What the signer vouches for, copied from run.json and manifest.json, and who signs."""
    plan = bundles.RunPlan.from_dict(bundles.read_typed(bundle / bundles.RUN_FILE, dict))
    manifest = bundles.read_typed(bundle / bundles.MANIFEST_FILE, dict)
    protocol = manifest.get("protocol") or {}
    return {
        "protocol": {
            "name": plan.protocol,
            "hash": plan.protocol_hash,
            "profile": protocol.get("profile"),
            "registration": plan.registration,
            "exploratory": plan.exploratory,
        },
        "lock": dict(plan.lock) or None,
        "chunk_heads": manifest.get("chunk_heads"),
        "code": {**(manifest.get("code") or {}), "adapter": manifest.get("adapter")},
        "sut_identity": manifest.get(IDENTITY_KEY),
        "packages": manifest.get("packages"),
        "python": manifest.get("python"),
        "device": manifest.get("device"),
        "signer": {"keyid": key_id(public_key), "public_key": base64.b64encode(_raw(public_key)).decode()},
        "signed": {"time": dt.datetime.now(dt.timezone.utc).isoformat(), "specval": __version__},
    }


def _sealed(bundle: Path) -> None:
    """SigningError unless the bundle is sealed and intact (SHA256SUMS matches every file)."""
    problems = bundles.check_listed_entries(bundle) + bundles.check_sums(bundle)
    if problems:
        raise SigningError(f"{bundle}: not a sealed, intact bundle, refusing to sign: {'; '.join(problems)}")


def sign_bundle(bundle: Path, private_key: Ed25519PrivateKey) -> str:
    """Write `signature.dsse.json` over the sealed bundle (replacing an earlier one); returns the
    key id. SigningError unless the bundle is sealed and intact."""
    _sealed(bundle)
    public_key = private_key.public_key()
    statement = {
        "_type": STATEMENT_TYPE,
        "predicateType": PREDICATE_TYPE,
        "subject": [{"name": name, "digest": {"sha256": digest}} for name, digest in sorted(subjects(bundle).items())],
        "predicate": predicate(bundle, public_key),
    }
    payload = bundles.json_text(statement).encode()
    envelope = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [
            {
                "keyid": key_id(public_key),
                "sig": base64.b64encode(private_key.sign(pae(PAYLOAD_TYPE, payload))).decode(),
            }
        ],
    }
    bundles.write_json(bundle / SIGNATURE_FILE, envelope)
    return key_id(public_key)


# ---------------------------------------------------------------- checking


def _statement(bundle: Path, public_key: Ed25519PublicKey | None) -> tuple[dict, Ed25519PublicKey]:
    """The signed Statement and the key that verified it (SigningError naming what is wrong)."""
    where = f"{SIGNATURE_FILE}:"
    envelope = bundles.read_typed(bundle / SIGNATURE_FILE, dict)
    try:
        payload = base64.b64decode(envelope["payload"], validate=True)
        (signature,) = envelope["signatures"]
        sig = base64.b64decode(signature["sig"], validate=True)
        statement = bundles.parse_json(payload, f"{SIGNATURE_FILE}'s payload")
        embedded = _crypto().Ed25519PublicKey.from_public_bytes(
            base64.b64decode(statement["predicate"]["signer"]["public_key"], validate=True)
        )
    except (KeyError, TypeError, ValueError) as err:
        raise SigningError(f"{where} not a DSSE envelope of a specval statement with one signature ({err})") from err
    if envelope.get("payloadType") != PAYLOAD_TYPE or statement.get("_type") != STATEMENT_TYPE:
        raise SigningError(f"{where} payloadType or _type is not an in-toto Statement")
    key = public_key or embedded
    if public_key is not None and _raw(public_key) != _raw(embedded):
        raise SigningError(f"{where} signed by key {key_id(embedded)}, not by the --key given ({key_id(public_key)})")
    whose = "the --key given" if public_key is not None else "the key the statement embeds"
    named_ids = (("the envelope's keyid", signature.get("keyid")), ("the signer's keyid", _signer_id(statement)))
    for field, named in named_ids:
        if named != key_id(key):
            raise SigningError(f"{where} {field} {named} is not the id {key_id(key)} of {whose}")
    try:
        key.verify(sig, pae(PAYLOAD_TYPE, payload))
    except _crypto().InvalidSignature as err:
        raise SigningError(f"{where} the signature does not verify under key {key_id(key)}") from err
    return statement, key


def _signer_id(statement: dict) -> Any:
    """The keyid the statement's predicate names for its signer (None if it names none)."""
    signer = (statement.get("predicate") or {}).get("signer")
    return signer.get("keyid") if isinstance(signer, dict) else None


def signing_sessions(bundle: Path) -> list[int]:
    """The sessions of sessions.json (their indices) whose command asked for a signature
    (`--sign`): such a bundle must carry one. An unreadable sessions.json: none (verify reports it)."""
    try:
        sessions = bundles.read_sessions(bundle)
    except bundles.READ_ERRORS:
        return []
    return [
        number
        for number, session in enumerate(sessions)
        if isinstance(session, dict)
        and isinstance(session.get("command"), list)
        and any(arg == SIGN_FLAG or str(arg).startswith(f"{SIGN_FLAG}=") for arg in session["command"])
    ]


def _subject_problems(bundle: Path, statement: dict) -> list[str]:
    try:
        signed = {entry["name"]: entry["digest"]["sha256"] for entry in statement["subject"]}
    except (KeyError, TypeError) as err:
        return [f"{SIGNATURE_FILE}: a subject is not {{name, digest.sha256}} ({err})"]
    here = subjects(bundle)
    return (
        [f"{name}: added after signing" for name in sorted(set(here) - set(signed))]
        + [f"{name}: removed after signing" for name in sorted(set(signed) - set(here))]
        + [f"{name}: changed after signing" for name in sorted(set(here) & set(signed)) if here[name] != signed[name]]
    )


def check_signature(bundle: Path, public_key: Ed25519PublicKey | None = None) -> SignatureCheck:
    """Whether the bundle's signature holds under `public_key` (None: the key the envelope
    embeds, which proves integrity since signing, not whose key it is), and the line verify
    prints. An unsigned bundle: no problem without `public_key`, one with it; a bundle whose
    sessions.json records a signing session (`--sign`) but holds no envelope: a problem either way.
    The envelope's keyid and the statement's signer keyid must both name the key that verifies."""
    if not os.path.lexists(bundle / SIGNATURE_FILE):
        signed_by = signing_sessions(bundle)
        if signed_by:
            return SignatureCheck(
                (
                    f"{SIGNATURE_FILE} is missing, but {bundles.SESSIONS_FILE} records a signing session "
                    f"({SIGN_FLAG}, session {signed_by[-1]}): the signature was removed",
                ),
                MISSING_LINE,
            )
        problems = (f"{SIGNATURE_FILE} is missing: --key needs a signed bundle",) if public_key else ()
        return SignatureCheck(problems, UNSIGNED_LINE)
    try:
        statement, key = _statement(bundle, public_key)
    except (SigningError, bundles.BundleError) as err:
        return SignatureCheck((str(err),), "signature: does not hold")
    whose = "the --key given" if public_key else "the key embedded in the bundle; pass --key to pin whose it is"
    return SignatureCheck(tuple(_subject_problems(bundle, statement)), f"signed by key {key_id(key)} ({whose})")


__all__ = [
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "SIGNATURE_FILE",
    "STATEMENT_TYPE",
    "SignatureCheck",
    "SigningError",
    "UNSIGNED_LINE",
    "check_signature",
    "generate_key_pair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "pae",
    "sign_bundle",
    "subjects",
]
