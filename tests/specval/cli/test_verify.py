"""`specval verify --sut-digest`: a bundle records the identity of the engine behind its adapter
(manifest.json's `sut_identity`, sealed and on the report's first screen), editing one line of
that engine's package changes the recorded digest, and verify pins it: OK naming the digest when
it matches, exit 1 with one line naming both digests when it does not, and a clear line for a
bundle made before identities (which verifies as before without the option).

The runs are the minimal adapter example's toy sampler at its smoke size (1000 samples per
group, seconds), installed here as the package `toyengine`, exploratory (the protocol's adapter
name differs from the frozen one). The assertions are on the evidence, not on the verdict: the
verdict is that of the example's own test (tests/specval/test_example_adapter.py)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specval import bundle as bundles
from specval import report
from specval.cli import main

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "adapter_minimal"
PACKAGE = "toyengine_cli"  # a name no other test imports: each xdist worker imports it afresh


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The example's toy adapter as the module `adapter` of a package that also holds an engine
    module (`core.py`), and its protocol naming that adapter."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text("ROUNDS = 1\n")
    shutil.copyfile(EXAMPLE / "toy_adapter.py", package / "adapter.py")
    protocol = (EXAMPLE / "protocol.yaml").read_text().replace("toy_adapter:ToySUT", f"{PACKAGE}.adapter:ToySUT")
    (tmp_path / "protocol.yaml").write_text(protocol)
    yield tmp_path
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        sys.modules.pop(name)


def _run(directory: Path) -> Path:
    args = ["run", str(directory / "protocol.yaml"), "--profile", "smoke", "--exploratory", "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return Path(result.output.strip().splitlines()[-1].removeprefix("bundle: "))


def _identity(bundle: Path) -> dict:
    return json.loads((bundle / bundles.MANIFEST_FILE).read_text())["sut_identity"]


def _verify(bundle: Path, *args: str):
    return CliRunner().invoke(main, ["verify", str(bundle), *args])


def test_an_edited_engine_module_changes_the_digest_and_verify_pins_it(toy):
    first = _run(toy)
    recorded = _identity(first)
    assert recorded["name"] == PACKAGE and recorded["covers"] == f"package {PACKAGE}: 3 file(s)"
    md, html = (first / "report.md").read_text(), (first / "report.html").read_text()
    for text in (md, html):
        assert f"system under test: {PACKAGE}, sha256 {recorded['digest']}" in text
        assert "specval git " in text  # specval's commit is labelled as specval's
    assert md.index("system under test:") < md.index("## Criteria")  # the first screen

    (toy / PACKAGE / "core.py").write_text("ROUNDS = 2\n")  # one line of the engine, not the adapter
    second = _run(toy)
    assert _identity(second)["digest"] != recorded["digest"]
    adapter_hashes = {json.loads((b / bundles.MANIFEST_FILE).read_text())["adapter"]["sha256"] for b in (first, second)}
    assert len(adapter_hashes) == 1  # what the adapter file's own hash cannot see

    passed = _verify(first, "--sut-digest", recorded["digest"].upper())
    assert passed.exit_code == 0, passed.output
    assert passed.output.splitlines()[-1].endswith(f"; tested the pinned system under test {recorded['digest']})")
    refused = _verify(second, "--sut-digest", recorded["digest"])
    assert refused.exit_code == 1, refused.output
    assert refused.output.splitlines()[-1] == (
        f"FAIL: {second}: system under test digest {_identity(second)['digest']}, expected {recorded['digest']}"
    )


def test_a_bundle_without_an_identity_cannot_be_pinned_and_otherwise_verifies(toy):
    bundle = _run(toy)
    manifest = json.loads((bundle / bundles.MANIFEST_FILE).read_text())
    digest = manifest.pop("sut_identity")["digest"]
    bundles.write_json(bundle / bundles.MANIFEST_FILE, manifest)  # as a bundle made before identities
    report.render(bundle)
    bundles.write_sums(bundle)
    assert "system under test:" not in (bundle / "report.md").read_text()
    plain = _verify(bundle)
    assert plain.exit_code == 0, plain.output
    pinned = _verify(bundle, "--sut-digest", digest)
    assert pinned.exit_code == 1, pinned.output
    assert pinned.output.splitlines()[-1] == (
        f"FAIL: {bundle}: cannot pin the system under test to {digest}: the bundle records no "
        "system-under-test identity (made before specval recorded one)"
    )


def test_a_digest_that_is_no_sha256_is_a_usage_error(toy):
    result = CliRunner().invoke(main, ["verify", str(toy), "--sut-digest", "abc123"])
    assert result.exit_code == 2
    assert re.search(r"--sut-digest.*'abc123' is not a SHA-256 digest \(64 hex digits\)", result.output)
