"""pytest plugin: a pre-registered protocol run against your adapter is one test of your suite.

Registered by entry point (`pytest11`) when specval is installed; from a source checkout, load it
with `pytest -p specval.pytest_plugin`. Two ways to use it (docs/harness.md section 12):

    @pytest.mark.specval("protocol.yaml", profile="smoke")
    def test_sampler_is_lossless(specval_result):      # reached only if the run PASSes
        assert specval_result.mdes["t2_gof.sync"] < 0.2

    def test_lossless(specval_run):                     # the fixture: a function that runs one
        specval_run("protocol.yaml", profile="smoke", sut="mypkg.adapter:MySUT")

Guarantees: the test fails unless the run's verdict is PASS, with a message naming the verdict,
every gating criterion that did not PASS (reason and MDE) and the bundle's path (`Result.explain`);
a refused protocol, an adapter that raises or an environment fault (disk full, an unreadable seed
ledger) fails it with one line (no harness traceback). The adapter runs in a worker process
(`specval.run`, specval.worker), never in pytest's: an adapter that ends it (`os._exit` with any
status, a signal, a crash) or hangs past SPECVAL_TIMEOUT_S fails the test with one line naming
what happened and the kept bundle, and the session goes on; only a bundle sealed by the run
passes it. A relative protocol path is read from the test file's folder. The bundle path and
verdict are recorded as the test's user properties (pytest's JUnit XML shows them). Bundles and
their seed ledger go to `--specval-output` (ini `specval_output`; default: a folder of pytest's
session temp dir); `--specval-profile P` overrides every profile (e.g. `ci` in CI).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

MARKER = "specval"
MARKER_HELP = (
    "specval(protocol, *, profile=None, sut=None, exploratory=False): run the protocol file "
    "(relative to the test file) through specval; the `specval_result` fixture holds its Result "
    "and the test fails unless it PASSes"
)
RESULT_FIXTURE = "specval_result"
MARKER_OPTIONS = ("profile", "sut", "exploratory", "seed_offset")
OUTPUT_OPTION, PROFILE_OPTION, OUTPUT_INI = "--specval-output", "--specval-profile", "specval_output"
DEFAULT_OUTPUT_DIR = "specval"  # under pytest's session temp dir


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specval", "specval: lossless checks of speculative-decoding samplers")
    group.addoption(
        OUTPUT_OPTION,
        default=None,
        metavar="DIR",
        help="Root of specval's bundles and seed ledger (default: a folder of the session temp dir).",
    )
    group.addoption(
        PROFILE_OPTION,
        default=None,
        metavar="PROFILE",
        help="Run every specval protocol at this profile (overrides the marker's and the call's).",
    )
    parser.addini(OUTPUT_INI, "Root of specval's bundles and seed ledger (as --specval-output).", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)


@pytest.fixture(scope="session")
def specval_output(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output root every specval run of the session writes to (one seed ledger: the runs of a
    session never share a seed)."""
    config = request.config
    if config.getoption(OUTPUT_OPTION):
        return Path(config.getoption(OUTPUT_OPTION)).absolute()  # relative to the working directory
    if config.getini(OUTPUT_INI):
        return config.rootpath / config.getini(OUTPUT_INI)  # relative to the rootdir (the ini file's folder)
    return tmp_path_factory.mktemp(DEFAULT_OUTPUT_DIR, numbered=True)


@pytest.fixture
def specval_run(request: pytest.FixtureRequest, specval_output: Path) -> Callable[..., Any]:
    """A function `(protocol, *, profile=None, sut=None, exploratory=False, check=True, **options) ->
    specval.Result` that runs the protocol (`specval.run`) into `specval_output`; with `check` (the
    default) it fails the test unless the verdict is PASS."""

    def run(protocol: str | Path, *, profile: str | None = None, check: bool = True, **options: Any):
        return run_protocol(request, specval_output, protocol, profile, check, options)

    return run


@pytest.fixture
def specval_result(request: pytest.FixtureRequest, specval_output: Path):
    """The Result of the protocol named by the test's `specval` marker, run while the test is set up
    (a refusal is a setup error); the test then fails before its body unless the run PASSed."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        pytest.fail(
            f"{request.node.nodeid}: the specval_result fixture needs @pytest.mark.{MARKER}(protocol, ...)",
            pytrace=False,
        )
    protocol, options = _marker_arguments(request, marker)
    return run_protocol(request, specval_output, protocol, options.pop("profile", None), False, options)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """A test whose `specval_result` did not PASS fails here, before its body: a FAIL or INCONCLUSIVE
    verdict is a failed test (a refused run was already a setup error)."""
    result = getattr(item, "funcargs", {}).get(RESULT_FIXTURE)
    if result is not None and not result.passed:
        pytest.fail(result.explain(), pytrace=False)


def _marker_arguments(request: pytest.FixtureRequest, marker: pytest.Mark) -> tuple[Any, dict]:
    unknown = sorted(set(marker.kwargs) - set(MARKER_OPTIONS))
    if len(marker.args) != 1 or unknown:
        pytest.fail(
            f"{request.node.nodeid}: @pytest.mark.{MARKER} takes one protocol path and the options "
            f"{MARKER_OPTIONS}; got args {marker.args!r}" + (f", unknown {unknown}" if unknown else ""),
            pytrace=False,
        )
    return marker.args[0], dict(marker.kwargs)


def run_protocol(
    request: pytest.FixtureRequest, output: Path, protocol: str | Path, profile: str | None, check: bool, options: dict
):
    """Run `protocol` (relative to the test file's folder) and record the bundle on the test; a run
    that does not end in PASS fails the test when `check`. Refusals and adapter failures fail it with
    one line; an interrupt ends the session (exit 130) naming the kept bundle."""
    path = Path(protocol) if Path(protocol).is_absolute() else Path(request.path).parent / protocol
    result, failure = _attempt(path, request.config.getoption(PROFILE_OPTION) or profile, output, options)
    if result is None:
        pytest.fail(failure, pytrace=False)  # outside the except block: no chained harness traceback
    request.node.user_properties += [("specval_bundle", str(result.bundle)), ("specval_verdict", result.verdict)]
    if check and not result.passed:
        pytest.fail(result.explain(), pytrace=False)
    return result


def _attempt(path: Path, profile: str | None, output: Path, options: dict):
    """(Result, None), or (None, the one line that says why there is none)."""
    import specval

    try:
        return specval.run(path, profile=profile, output=output, **options), None
    except specval.WorkerDied as err:  # before SUTRaised, which it is: it may come after seeds were claimed
        return None, f"specval: {err}"
    except (*specval.INPUT_ERRORS, specval.SUTRaised, ValueError, TypeError) as err:  # a bad argument too
        return None, f"specval refused the run before any seed was claimed: {err}"  # err names the file
    except specval.RunFailed as err:
        return None, f"specval: {err}; traceback in {err.log}; bundle {err.path} kept (specval.resume)"
    except specval.ENVIRONMENT_ERRORS as err:
        kept = f"; bundle {err.path} kept (specval.resume)" if isinstance(err, specval.EnvironmentFailed) else ""
        return None, f"specval: environment: {err}{kept}"
    except specval.RunInterrupted as err:
        pytest.exit(f"specval interrupted; bundle {err.path} kept (specval run --resume)", returncode=130)
