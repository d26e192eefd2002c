"""The harness without torch (`pip install specval`, no extra): every specval module outside
specval/adapters/ imports, the example adapter's frozen protocol (examples/adapter_minimal/, numpy
only) PASSes and verifies, and what needs torch is refused with one line naming the extra to install.

Each check runs in a fresh interpreter whose imports of torch and triton are blocked by a meta-path
finder installed before specval is imported (BLOCKER): it raises ModuleNotFoundError as an absent
package does, so the harness sees exactly what a light install shows it (the API run's worker
process too, through a sitecustomize module). The installed light
wheel itself is measured by hand (CHANGELOG.md, "Unreleased").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specval.sut import ADAPTER_EXTRAS, ENTRY_POINT_GROUP

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "adapter_minimal"
BLOCKED = ("torch", "triton")
BLOCKER = f"""
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
"""
CLI = BLOCKER + "from specval.cli import main\nmain(sys.argv[1:], prog_name='specval')\n"
INSTALL_LINE = 'pip install "specval[engine]"'


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0) for requirement in requirements}


def test_the_harness_depends_on_no_torch_and_each_adapter_names_its_extra():
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    assert not set(BLOCKED) & _names(project["dependencies"]), project["dependencies"]
    assert set(BLOCKED) <= _names(extras["engine"])
    assert extras["transformers"] == extras["crosscheck"]  # the adapter's name, and the cross-checks' first name
    entry_points = project["entry-points"][ENTRY_POINT_GROUP]
    assert {value.partition(":")[0] for value in entry_points.values()} == set(ADAPTER_EXTRAS)
    assert set(ADAPTER_EXTRAS.values()) <= set(extras)


def harness_modules() -> list[str]:
    """Every module of specval outside specval/adapters/ (`__main__` modules run a command when
    imported and are left out)."""
    names = []
    for path in sorted((ROOT / "specval").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[1] == "adapters" or parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _python(code: str, *args: str, cwd: Path, extra_path: Path | None = None, **env: str):
    paths = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **env}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def example(tmp_path) -> Path:
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_the_harness_imports_and_the_example_passes_without_torch(example, tmp_path):
    """One interpreter, torch and triton blocked: import every harness module, then run the
    example's frozen protocol at its smoke size through `specval.run` (confirmatory), verify the
    bundle, and report what got imported. False-fail rate: that of
    tests/specval/test_example_adapter.py's PASS (fixed seeds: it passes or fails for good)."""
    modules = harness_modules()
    assert "specval.distribution.sharding" in modules and "specval.bundle.facts" in modules
    assert not any(name.startswith("specval.adapters") for name in modules)
    script = (
        BLOCKER
        + f"""
import importlib, json
for name in {modules!r}:
    importlib.import_module(name)
after_imports = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton", "engine"))
import specval
result = specval.run("protocol.yaml", profile="smoke", output={str(tmp_path / "out")!r})
manifest = json.loads((result.bundle / "manifest.json").read_text())
print(json.dumps({{
    "after_imports": after_imports,
    "verdict": result.verdict,
    "verified": specval.verify(result.bundle).ok,
    "device": {{k: manifest["device"].get(k) for k in ("cuda", "torch")}},
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton", "engine")),
}}))
"""
    )
    # specval.run's worker is a fresh Python: the same blocker reaches it as sitecustomize, which
    # every interpreter with the example's folder on PYTHONPATH imports at start
    (example / "sitecustomize.py").write_text(BLOCKER)
    done = _python(script, cwd=example, extra_path=example)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["after_imports"] == [] and facts["loaded"] == []
    assert facts["verdict"] == "PASS" and facts["verified"] is True
    assert facts["device"] == {"cuda": None, "torch": "not installed"}


def _one_line_refusal(done, *needles: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_the_engine_adapter_without_torch_is_refused_with_the_install_line(tmp_path):
    """sut.adapter `engine` (t2_fp32's default) without torch: exit 2, as any adapter that cannot be
    imported (an input error found before any seed is claimed), one line with the install command."""
    done = _python(CLI, "run", str(ROOT / "protocols" / "t2_fp32.yaml"), "--output", "out", "--quiet", cwd=tmp_path)
    _one_line_refusal(done, "sut.adapter: 'engine' needs torch", INSTALL_LINE)
    assert not (tmp_path / "out" / "ledger.json").exists()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--devices", "2"], {}),  # the launcher (torch.distributed.run)
        ([], {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}),  # a rank that would join the group
    ],
    ids=["devices", "torchrun-rank"],
)
def test_a_multi_process_run_without_torch_is_refused_with_the_install_line(example, args, env):
    done = _python(
        CLI,
        "run",
        "protocol.yaml",
        *("--profile", "smoke", "--output", "out", "--quiet", *args),
        cwd=example,
        extra_path=example,
        **env,
    )
    _one_line_refusal(done, "torch.distributed", "torch is not installed", INSTALL_LINE)
    assert not (example / "out" / "ledger.json").exists()


def test_devices_on_a_cuda_protocol_without_torch_is_refused_with_the_install_line(tmp_path):
    """--devices 2 of a CUDA protocol counts the host's GPUs first: without torch one line naming
    the extra (exit 2), not a traceback from the count."""
    protocol = ROOT / "protocols" / "t2_cuda.yaml"
    done = _python(CLI, "run", str(protocol), "--devices", "2", "--output", "out", "--quiet", cwd=tmp_path)
    _one_line_refusal(done, "torch is not installed", INSTALL_LINE)
    assert not (tmp_path / "out" / "ledger.json").exists()


PERFORMANCE = ROOT / "protocols" / "performance"


@pytest.mark.parametrize(
    ("command", "protocol", "needles"),
    [
        (
            "bench",
            PERFORMANCE / "perf_async_vs_serial_graphs_c1.yaml",
            ("its arms run the bundled engine, which needs torch", INSTALL_LINE),
        ),
        (
            "bench",
            PERFORMANCE / "perf_transformers_assisted_vs_plain.yaml",
            ("sut.adapter: 'transformers' needs torch", 'pip install "specval[transformers]"'),
        ),
        (
            "run",
            ROOT / "protocols" / "t2_transformers.yaml",
            ("sut.adapter: 'transformers' needs torch", 'pip install "specval[transformers]"'),
        ),
    ],
    ids=["bench-engine", "bench-transformers", "run-transformers"],
)
def test_a_torch_adapter_without_torch_is_refused_with_its_extra(tmp_path, command, protocol, needles):
    """A performance protocol on the bundled engine, and the transformers adapter (whose torch imports
    are lazy), without torch: exit 2 before any bundle or seed, one line naming the extra."""
    done = _python(CLI, command, str(protocol), "--output", "out", "--quiet", cwd=tmp_path)
    _one_line_refusal(done, *needles)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
