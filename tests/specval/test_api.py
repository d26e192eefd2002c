"""The public Python API (specval.run / resume / verify, Result), tested as a user calls it: through the
`specval` package, on the exact fake adapter (tests/fixtures/fake_sut.py).

False-fail rate of the PASS assertions: the fake protocol's ci run has two p-valued gating families at
alpha 0.01 on fixed seeds, so its outcome is fixed on a platform; a correct sampler would fail it with
probability <= 0.02 over seed choices (Holm within each family). The FAIL assertions are deterministic:
the planted bug (correction drawn from p) is caught by the exact quadrature, which has no sampling error.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

import specval
from specval import seeds
from specval.api import sut_factory
from specval.protocol import SutSpec
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import BuggyFakeSUT, FakeSUT
from tests.fixtures.fault_suts import RaisingSUT


@pytest.fixture(scope="module")
def passed(tmp_path_factory) -> tuple[specval.Result, Path]:
    """One PASS run of the fake protocol's ci profile (shared: a run takes seconds), and its JUnit file
    (in folders that do not exist yet: the run creates them)."""
    root = tmp_path_factory.mktemp("api")
    junit = root / "out" / "ci" / "j.xml"
    return specval.run(
        write_protocol(root, fake_protocol_dict()), profile="ci", output=root / "out", junit=junit
    ), junit


def test_run_returns_the_bundles_verdict_criteria_and_mdes(passed):
    result, junit = passed
    assert isinstance(result, specval.Result) and result.passed and result.verdict == "PASS"
    assert result.bundle.parent.name == "out" and (result.bundle / "SHA256SUMS").is_file()
    assert (result.protocol, result.profile, result.kind, result.exploratory) == (
        "fake_t2",
        "ci",
        "distribution",
        False,
    )
    t2 = result.criterion("t2_gof.sync")
    assert t2.gating and t2.role == "primary" and t2.verdict == "PASS" and t2.sample_size == 800
    assert 0 < t2.mde < 1 and t2.p_value is not None and t2.statistic is not None and "TV of t2" in t2.mde_label
    assert result.mdes["t2_gof.sync"] == t2.mde and "out_of_range.sync" not in result.mdes  # no MDE: deterministic
    assert result.failing == () and not result.criterion("t1_gof.sync").line().startswith("FAIL")
    with pytest.raises(KeyError, match="no criterion 'nope'"):
        result.criterion("nope")
    assert specval.Result.from_bundle(result.bundle) == result  # the record read back is the result returned
    assert ET.parse(junit).getroot().get("tests") == str(len(result.criteria))


def test_verify_finds_no_difference_then_the_tampered_file(passed, tmp_path):
    result, _ = passed
    verification = specval.verify(result.bundle)
    assert verification.ok and verification.differences == () and verification.bundle == result.bundle
    copy = shutil.copytree(result.bundle, tmp_path / result.bundle.name)
    summary = copy / "summary.json"
    summary.write_text(summary.read_text().replace('"verdict": "PASS"', '"verdict": "FAIL"', 1))
    tampered = specval.verify(str(copy))
    assert not tampered.ok and any("summary.json" in d for d in tampered.differences)
    with pytest.raises(specval.BundleError, match="not a bundle"):
        specval.verify(tmp_path)


def test_sut_argument_replaces_the_protocols_adapter_and_failing_names_what_failed(tmp_path):
    """The buggy adapter given as `sut` to an unfrozen protocol run exploratory: FAIL, and says both."""
    unfrozen = write_protocol(tmp_path, fake_protocol_dict(), frozen=False)
    result = specval.run(unfrozen, profile="ci", sut=BuggyFakeSUT, output=tmp_path / "out", exploratory=True)
    assert result.verdict == "FAIL" and not result.passed and result.exploratory
    names = [c.name for c in result.failing]
    assert "quadrature.adversarial" in names and all(c.gating and c.verdict != "PASS" for c in result.failing)
    assert result.failing[0].verdict == "FAIL"
    text = result.explain()
    assert text.splitlines()[0].startswith("fake_t2 (ci): EXPLORATORY FAIL")
    assert f"bundle: {result.bundle}" in text and "quadrature.adversarial" in text
    quadrature = next(line for line in text.splitlines() if "quadrature.adversarial:" in line)
    assert "|swept law - exact law| = " in quadrature and " at token " in quadrature and "[MDE" not in quadrature
    lines = [line for line in text.splitlines()[1:] if "_gof." in line or "_homogeneity." in line]
    sized = [line for line in lines if line.split()[0] == "FAIL"]
    assert sized, text
    assert all("observed TV" in line and "worst stratum" in line and "[MDE" not in line for line in sized), text
    assert specval.verify(result.bundle).ok  # the sized rows recompute as stored
    assert (result.bundle / "report.md").read_text().startswith("# fake_t2: EXPLORATORY FAIL\n")
    sessions = (result.bundle / "sessions.json").read_text()
    assert "specval.run" in sessions and "sut=tests.fixtures.fake_sut:BuggyFakeSUT" in sessions


@pytest.mark.parametrize(
    "sut", ["tests.fixtures.fake_sut:BuggyFakeSUT", BuggyFakeSUT, lambda spec, k: BuggyFakeSUT(spec, k)]
)
def test_every_form_of_the_sut_argument_builds_the_adapter(sut):
    spec = SutSpec(adapter="engine")
    assert isinstance(sut_factory(sut)(spec, 3), BuggyFakeSUT)
    assert sut_factory(None) is None


def test_refusals_raise_before_any_seed_is_claimed(tmp_path):
    out = tmp_path / "out"
    unfrozen = write_protocol(tmp_path, fake_protocol_dict(), "unfrozen.yaml", frozen=False)
    with pytest.raises(specval.ProtocolError, match="frozen"):
        specval.run(unfrozen, profile="ci", output=out)
    with pytest.raises(specval.ProtocolError, match="cannot read protocol"):
        specval.run(tmp_path / "missing.yaml", output=out)
    with pytest.raises(specval.SUTError, match="nowhere.at_all:Missing"):
        specval.run(write_protocol(tmp_path, fake_protocol_dict()), sut="nowhere.at_all:Missing", output=out)
    with pytest.raises(TypeError, match="not a subclass of specval.sut.SUT"):
        specval.run(tmp_path / "protocol.yaml", sut=int, output=out)
    assert all(issubclass(e, Exception) for e in specval.INPUT_ERRORS)
    assert not seeds.read_ledger(out)


def test_an_adapter_that_raises_keeps_the_bundle_and_resume_finishes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FAULT_RAISE_AT_CALL", "4")  # after the probe's 2 calls and one batch of the run
    announced = []
    with pytest.raises(specval.RunFailed) as caught:
        specval.run(
            write_protocol(tmp_path, fake_protocol_dict()),
            profile="ci",
            sut=RaisingSUT,
            output=tmp_path / "out",
            announce=announced.append,
        )
    bundle = caught.value.path
    assert announced == [bundle] and not (bundle / "SHA256SUMS").exists()
    result = specval.resume(bundle, sut=FakeSUT)
    assert result.passed and result.bundle == bundle and specval.verify(bundle).ok


def test_a_performance_protocol_takes_no_sut(tmp_path):
    raw = {"kind": "performance", "name": "perf_x"}  # refused before it is parsed further
    path = tmp_path / "perf.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="performance protocol .* takes no sut"):
        specval.run(path, sut=FakeSUT)


def test_the_package_exports_the_api_lazily():
    """Deterministic. `import specval` stays cheap (the API loads on first use), every public name
    resolves to specval.api's object, and an unknown name is an AttributeError."""
    code = "import sys, specval; assert 'specval.api' not in sys.modules and 'numpy' not in sys.modules"
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True).returncode == 0
    api = importlib.import_module("specval.api")
    for name in ("run", "resume", "verify", "Result", "Criterion", "Verification", "RunFailed", "SUTRaised"):
        assert getattr(specval, name) is getattr(api, name) and name in dir(specval)
    with pytest.raises(AttributeError, match="no attribute 'runn'"):
        specval.runn  # noqa: B018


def test_an_unreadable_seed_ledger_is_an_environment_error(tmp_path):
    """Deterministic: a ledger.json that is a directory (the output root's state, exit 5 on the CLI)."""
    (tmp_path / "out" / "ledger.json").mkdir(parents=True)
    with pytest.raises(specval.ENVIRONMENT_ERRORS):
        specval.run(write_protocol(tmp_path, fake_protocol_dict()), profile="ci", output=tmp_path / "out")
    assert not [p for p in (tmp_path / "out").iterdir() if (p / "run.json").exists()]  # no bundle was started
