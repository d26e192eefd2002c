"""Signed bundles: `specval keygen`, `run --sign`, `sign`, `verify --key`. A signature holds only
while every byte signed is unchanged (a re-seal included), names its key, and is refused under
another team's key; an unsigned bundle says it proves internal consistency only. Deterministic:
the fake SUT's fixed run, no statistic asserted."""

from __future__ import annotations

import base64
import html
import json
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from specval import bundle as bundles
from specval import signing
from specval.cli import main
from specval.report import signer
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.small_bundles import SMALL


def _cli(*args: str):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("keys")
    for name in ("team", "forger"):
        assert _cli("keygen", root / name).exit_code == 0
    return {
        "team": root / "team",
        "team.pub": root / "team.pub",
        "forger": root / "forger",
        "forger.pub": root / "forger.pub",
    }


@pytest.fixture(scope="module")
def signed(tmp_path_factory, keys) -> Path:
    """A bundle made by `specval run --sign` with the team's key."""
    root = tmp_path_factory.mktemp("signed")
    protocol = write_protocol(root, fake_protocol_dict(**SMALL))
    result = _cli("run", protocol, "--profile", "ci", "--output", root / "results", "--quiet", "--sign", keys["team"])
    assert result.exit_code == 0, result.output
    (path,) = (root / "results").glob("fake_t2-*")
    assert f"signed: {path / signing.SIGNATURE_FILE} (key " in result.output
    return path


@pytest.fixture
def copy(signed, tmp_path) -> Path:
    return Path(shutil.copytree(signed, tmp_path / signed.name))


def _key_id(keys, name: str) -> str:
    return signing.key_id(signing.load_public_key(keys[f"{name}.pub"]))


def _statement(bundle: Path) -> dict:
    envelope = json.loads((bundle / signing.SIGNATURE_FILE).read_text())
    return json.loads(base64.b64decode(envelope["payload"]))


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(keys):
    assert stat.S_IMODE(keys["team"].stat().st_mode) == signing.PRIVATE_KEY_MODE
    assert keys["team.pub"].read_text().startswith("-----BEGIN PUBLIC KEY-----")
    result = _cli("keygen", keys["team"])
    assert result.exit_code == 2 and "exists; a key file is never overwritten" in result.output


def test_a_signed_bundle_verifies_under_its_key_and_names_it(signed, keys):
    team = _key_id(keys, "team")
    pinned = _cli("verify", signed, "--key", keys["team.pub"])
    assert pinned.exit_code == 0 and f"signed by key {team} (the --key given)" in pinned.output, pinned.output
    embedded = signing.check_signature(signed)
    assert embedded.problems == () and embedded.line.startswith(f"signed by key {team} (the key embedded in the bundle")
    for name in ("report.md", "report.html"):  # the first screen names the key, before the criteria
        text = html.unescape((signed / name).read_text())
        assert text.index(signer.signed_text(team)) < text.index("Criteria"), name


def test_a_signature_swapped_for_another_keys_leaves_a_report_naming_the_first(copy, keys):
    """Signed again without re-rendering (the bare library call): the signature holds, but the
    report still names the team's key, and verify's re-rendering from the new envelope differs."""
    signing.sign_bundle(copy, signing.load_private_key(keys["forger"]))
    assert signing.check_signature(copy).problems == ()
    result = _cli("verify", copy)
    assert result.exit_code == 1 and "DIFFERS report.md: differs from its re-rendering" in result.output


def test_the_envelope_is_dsse_over_an_in_toto_statement_of_every_file(signed, keys):
    envelope = json.loads((signed / signing.SIGNATURE_FILE).read_text())
    payload = base64.b64decode(envelope["payload"])
    raw = keys["team.pub"].read_bytes()
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    public: Ed25519PublicKey = load_pem_public_key(raw)
    public.verify(
        base64.b64decode(envelope["signatures"][0]["sig"]),  # raises unless it verifies
        b"DSSEv1 %d %s %d %s" % (len(signing.PAYLOAD_TYPE), signing.PAYLOAD_TYPE.encode(), len(payload), payload),
    )
    statement = json.loads(payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    files = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert set(files) == set(bundles.regular_files(signed)) - {signing.SIGNATURE_FILE}
    assert "SHA256SUMS" in files and files["summary.json"] == bundles.sha256_file(signed / "summary.json")
    predicate, run = statement["predicate"], bundles.read_json(signed / bundles.RUN_FILE)
    assert predicate["protocol"]["hash"] == run["protocol_hash"] and predicate["protocol"]["registration"] == "frozen"
    assert predicate["lock"]["entry"] == run["protocol_hash"] and predicate["lock"]["sha256"]
    assert predicate["code"]["adapter"]["module"] == "tests.fixtures.fake_sut"
    assert predicate["code"]["adapter"]["sha256"] and predicate["code"]["source_sha256"]
    manifest = bundles.read_json(signed / bundles.MANIFEST_FILE)
    # the statement carries the manifest's identity record, whatever it holds (what the default
    # identity records is tests/specval/test_identity.py's; under xdist it once came out unrecorded)
    assert predicate["sut_identity"] == manifest["sut_identity"] and predicate["sut_identity"]
    assert predicate["chunk_heads"] == {"chunks.json": bundles.chain_head(signed)}
    assert predicate["signer"]["keyid"] == _key_id(keys, "team") and "device" in predicate


def test_pae_matches_the_dsse_specification_example():
    assert (
        signing.pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_a_byte_changed_after_signing_fails_even_when_resealed(copy, keys):
    manifest = bundles.read_json(copy / bundles.MANIFEST_FILE)
    manifest["command"] = ["specval", "run", "something-else.yaml"]  # no recomputation sees this field
    bundles.write_json(copy / bundles.MANIFEST_FILE, manifest)
    bundles.write_sums(copy)
    for key in (None, signing.load_public_key(keys["team.pub"])):
        assert signing.check_signature(copy, key).problems == (
            "SHA256SUMS: changed after signing",
            "manifest.json: changed after signing",
        )
    result = _cli("verify", copy, "--key", keys["team.pub"])
    assert result.exit_code == 1 and "DIFFERS manifest.json: changed after signing" in result.output


def test_a_forger_who_re_signs_is_named_and_refused_under_the_teams_key(copy, keys):
    manifest = bundles.read_json(copy / bundles.MANIFEST_FILE)
    manifest["command"] = ["specval", "run", "something-else.yaml"]
    bundles.write_json(copy / bundles.MANIFEST_FILE, manifest)
    bundles.write_sums(copy)
    assert _cli("sign", copy, "--key", keys["forger"]).exit_code == 0
    embedded = signing.check_signature(copy)  # self-consistent: only the key id tells
    assert embedded.problems == () and embedded.line.startswith(f"signed by key {_key_id(keys, 'forger')}")
    pinned = signing.check_signature(copy, signing.load_public_key(keys["team.pub"]))
    assert pinned.problems == (
        f"{signing.SIGNATURE_FILE}: signed by key {_key_id(keys, 'forger')}, not by the "
        f"--key given ({_key_id(keys, 'team')})",
    )


def test_a_tampered_signature_does_not_verify(copy, keys):
    envelope = json.loads((copy / signing.SIGNATURE_FILE).read_text())
    sig = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    sig[0] ^= 1
    envelope["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    bundles.write_json(copy / signing.SIGNATURE_FILE, envelope)
    (problem,) = signing.check_signature(copy).problems
    assert "the signature does not verify under key" in problem


def test_an_unsigned_bundle_says_so_and_fails_under_a_key(copy, keys):
    (copy / signing.SIGNATURE_FILE).unlink()
    removed = _cli("verify", copy)  # the report still names the signer: its re-rendering says unsigned
    assert removed.exit_code == 1 and "DIFFERS report.md: differs from its re-rendering" in removed.output
    assert _cli("report", copy).exit_code == 0  # re-rendered as unsigned, re-sealed
    plain = _cli("verify", copy)
    assert plain.exit_code == 0 and "unsigned: internal consistency only" in plain.output
    assert signer.UNSIGNED_TEXT in (copy / "report.md").read_text()
    team = signing.load_public_key(keys["team.pub"])
    assert signing.check_signature(copy, team).problems == (
        "signature.dsse.json is missing: --key needs a signed bundle",
    )
    assert _cli("sign", copy, "--key", keys["team"]).exit_code == 0  # a sealed bundle is signed afterwards
    assert signing.check_signature(copy, team).problems == ()
    assert _cli("verify", copy, "--key", keys["team.pub"]).exit_code == 0
    assert signer.signed_text(_key_id(keys, "team")) in (copy / "report.md").read_text()


def test_sign_refuses_a_bundle_that_does_not_verify(copy, keys):
    manifest = bundles.read_json(copy / bundles.MANIFEST_FILE)
    bundles.write_json(copy / bundles.MANIFEST_FILE, {**manifest, "command": ["edited"]})
    result = _cli("sign", copy, "--key", keys["team"])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "refusing to sign" in result.output
    assert "manifest.json: sha256 differs" in result.output


def test_sign_re_renders_an_edited_report_from_the_bundle(copy, keys):
    """The report is the one file `specval sign` rewrites (as `specval report` does): an edit to
    it is replaced by the rendering from the bundle's other files, naming the new signer."""
    rendered = (copy / "report.md").read_bytes()
    (copy / "report.md").write_text("# edited\n")
    assert _cli("sign", copy, "--key", keys["forger"]).exit_code == 0
    forger = _key_id(keys, "forger")
    expected = rendered.replace(_key_id(keys, "team").encode(), forger.encode())
    assert (copy / "report.md").read_bytes() == expected
    assert signing.check_signature(copy).problems == () and _cli("verify", copy).exit_code == 0


def test_a_bad_key_is_refused_before_anything_is_claimed(tmp_path, keys):
    protocol = write_protocol(tmp_path, fake_protocol_dict(**SMALL))
    result = _cli("run", protocol, "--output", tmp_path / "results", "--sign", keys["team.pub"])
    assert result.exit_code == 2 and "not an unencrypted PEM private key" in result.output
    assert not (tmp_path / "results").exists()
    result = _cli("verify", tmp_path, "--key", keys["team"])  # a private key where the public one belongs
    assert result.exit_code == 2 and "not a PEM public key" in result.output


def test_the_api_checks_signatures_and_pins_as_specval_verify_does(copy, keys):
    """`specval.api.verify` is the path `specval verify` takes: the same key checks, lines and pins."""
    from specval import api

    team, found = _key_id(keys, "team"), api.verify(copy)
    assert found.ok and found.signature.startswith(f"signed by key {team} (the key embedded in the bundle")
    assert api.verify(copy, key=keys["team.pub"]).signature == f"signed by key {team} (the --key given)"
    forged = api.verify(copy, key=keys["forger.pub"])
    assert not forged.ok and f"signed by key {team}, not by the --key given" in forged.differences[0]
    pinned = api.verify(copy, protocol_hash="0" * 64)
    assert not pinned.ok and pinned.pinned == "0" * 64 and "not the pinned" in pinned.differences[-1]
    with pytest.raises(signing.SigningError, match="not a PEM public key"):
        api.verify(copy, key=keys["team"])
    with pytest.raises(api.ProtocolError, match="not a SHA-256 in hex"):
        api.verify(copy, protocol_hash="xyz")
    (copy / "report.md").write_text("# edited\n")  # a byte changed after signing: the signature and the re-render
    changed = api.verify(copy, key=keys["team.pub"])
    assert "report.md: changed after signing" in changed.differences and not changed.ok
    (copy / signing.SIGNATURE_FILE).unlink()
    unsigned = api.verify(copy)
    assert unsigned.signature == "unsigned: internal consistency only"
    assert (
        "signature.dsse.json is missing: --key needs a signed bundle"
        in api.verify(copy, key=keys["team.pub"]).differences
    )


def test_running_and_verifying_unsigned_bundles_never_imports_cryptography(copy):
    """cryptography is imported on the first signing call only: the CLI, the API and both runners
    import without it, and an unsigned bundle verifies with the package made unimportable."""
    import subprocess
    import sys

    (copy / signing.SIGNATURE_FILE).unlink()
    assert _cli("report", copy).exit_code == 0  # the report re-rendered as unsigned
    code = (
        "import sys; from click.testing import CliRunner; "
        "import specval.cli, specval.api, specval.sequence.runner, specval.distribution.runner; "
        "loaded = 'cryptography' in sys.modules; sys.modules['cryptography'] = None; "
        f"result = CliRunner().invoke(specval.cli.main, ['verify', {str(copy)!r}]); "
        "print(loaded, result.exit_code, result.output.splitlines()[0])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False 0 unsigned: internal consistency only", result.stdout + result.stderr
