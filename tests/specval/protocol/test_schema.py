"""Protocol schema: every bad field is an error naming key, value and file; the hash is canonical."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml

from specval import protocol as protocols
from specval.protocol import ProtocolError, load_protocol, parse_protocol, resolve
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

REPO = Path(__file__).resolve().parents[3]


def _mutated(path: list, value) -> dict:
    raw = fake_protocol_dict()
    node = raw
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return raw


BAD_FIELDS = [
    # (path to the field, bad value, words the message must contain)
    (["nmae"], "x", ["nmae", "unknown key", "'name'"]),
    (["name"], "Bad-Name", ["name", "'Bad-Name'"]),
    (["prompt"], KeyError, ["prompt", "missing required key"]),
    (["prompt"], "", ["prompt", "non-empty string"]),
    (["sampling", "temperature"], 0.0, ["sampling.temperature", "0.0"]),
    (["sampling", "temperature"], "hot", ["sampling.temperature", "'hot'"]),
    (["sampling", "top_k"], -2, ["sampling.top_k", "-2"]),
    (["sampling", "top_k"], 2.5, ["sampling.top_k", "2.5"]),
    (["sampling", "top_p"], 0.0, ["sampling.top_p", "(0, 1]"]),
    (["sampling", "top_p"], 1.5, ["sampling.top_p", "1.5"]),
    (["sampling", "topk"], 3, ["sampling.topk", "'top_k'"]),
    (["num_speculative_tokens"], 0, ["num_speculative_tokens", ">= 1"]),
    (["positions"], 4, ["positions", "at most 3", "kind: sequence"]),
    (["positions"], True, ["positions", "integer"]),
    (["groups"], [], ["groups", "non-empty list"]),
    (["groups", 1, "name"], "nospec", ["groups", "duplicate group name"]),
    (["groups", 1, "draft_loops"], 0, ["groups[1].draft_loops", ">= 1"]),
    (["groups", 1, "drafts"], 2, ["groups[1].drafts", "unknown key"]),
    (["samples_per_group"], 0, ["samples_per_group", ">= 1"]),
    (["alpha"], 1.0, ["alpha", "[1e-06, 0.2]", "1.0"]),
    (["alpha"], 1e-300, ["alpha", "Monte Carlo draws", "1e-300"]),
    (["confirmation"], {"stages": 2, "alpha_stage2": 1e-300}, ["confirmation.alpha_stage2", "1e-300"]),
    (["sequential"], [0.5, 1.0], ["sequential", "mapping", "[0.5, 1.0]"]),
    (["sequential"], {"looks": [1.0]}, ["sequential.looks", "fixed-size design", "[1.0]"]),
    (["sequential"], {"looks": [0.5, 0.25, 1.0]}, ["sequential.looks", "increase strictly", "[0.5, 0.25, 1.0]"]),
    (["sequential"], {"looks": [0.25, 0.5]}, ["sequential.looks", "last look must be at 1.0", "[0.25, 0.5]"]),
    (["sequential"], {"looks": [0.5, "all"]}, ["sequential.looks[1]", "number", "'all'"]),
    (["sequential"], {"looks": [0.5, 1.5]}, ["sequential.looks[1]", "(0, 1]", "1.5"]),
    (["sequential"], {"looks": [0.5, 1.0], "spending": "obrien"}, ["sequential.spending", "'pocock'", "'obrien'"]),
    (["sequential"], {"looks": [0.5, 1.0], "spend": "pocock"}, ["sequential.spend", "unknown key", "'spending'"]),
    (["sequential"], {"spending": "pocock"}, ["sequential.looks", "missing required key"]),
    (["sequential"], {"looks": [0.001, 1.0]}, ["sequential.looks", "first look sees 2 of", "[0.001, 1.0]"]),
    (["sequential"], {"looks": [0.9995, 1.0]}, ["sequential.looks", "repeat a size", "[0.9995, 1.0]"]),
    (["power"], 0.0, ["power", "[0.5, 0.9999]"]),
    (["power"], 0.3, ["power", "minimum detectable effect"]),
    (["sampling", "temperature"], 1e-300, ["sampling.temperature", ">= 1e-05", "greedy", "1e-300"]),
    (["sampling", "top_k"], 1, ["sampling.top_k", "greedy"]),
    (["sampling", "top_k"], 2**40, ["sampling.top_k", "<= 4294967296"]),
    (["min_expected"], 1e308, ["min_expected", "samples_per_group (1200)", "nothing could be tested", "1e+308"]),
    (["profiles", "ci", "samples_per_group"], 9, ["min_expected", "profiles.ci.samples_per_group (9)"]),
    (["samples_per_group"], 10**15, ["samples_per_group", "<= 4294967296"]),
    (["seed_base"], 2**64, ["seed_base", "<= 4294967296"]),
    (["stratum_min"], 0, ["stratum_min", ">= 1"]),
    (["min_expected"], 0, ["min_expected", "> 0"]),
    (["multiplicity"], "holms", ["multiplicity", "'holm'"]),
    (["confirmatory"], "yes", ["confirmatory", "true or false"]),
    (["chunk_size"], 0, ["chunk_size", ">= 1"]),
    (["seed_base"], -5, ["seed_base", ">= 0"]),
    (["sut", "adaptor"], "engine", ["sut.adaptor", "'adapter'"]),
    (["sut", "options"], [1], ["sut.options", "mapping"]),
    (["tests", 0, "kind"], "gofx", ["tests[0].kind", "'gof'"]),
    (["tests", 0, "role"], "primray", ["tests[0].role", "'primary'"]),
    (["tests", 0, "position"], 1, ["tests[0].position", "quadrature"]),
    (["tests", 1, "position"], 5, ["tests[1].position", "exceeds positions"]),
    (["tests", 1, "groups"], ["snyc"], ["tests[1].groups", "'sync'"]),
    (["tests", 1, "baseline"], "nospec", ["tests[1].baseline", "only homogeneity"]),
    (["tests", 3, "baseline"], KeyError, ["tests[3].baseline", "non-empty string"]),
    (["tests", 0, "tol"], -1.0, ["tests[0].tol", "> 0"]),
    (["tests", 3, "by_path"], True, ["tests[3].by_path", "only gof"]),
    (["tests", 0, "groups"], ["nospec"], ["tests[0].groups", "speculative groups", "'nospec'"]),
    (["tests", 3, "groups"], ["nospec"], ["tests[3].groups", "other than the baseline"]),
    (["profiles", "ci", "samples"], 5, ["profiles.ci.samples", "'samples_per_group'"]),
    (["profiles", "ci", "samples_per_group"], 0, ["profiles.ci.samples_per_group", ">= 1"]),
]


@pytest.mark.parametrize(
    "path,value,words", BAD_FIELDS, ids=[".".join(map(str, f[0])) + f"={f[1]!r}" for f in BAD_FIELDS]
)
def test_bad_field_is_named_with_file_and_value(tmp_path, path, value, words):
    file = write_protocol(tmp_path, _mutated(path, value))
    with pytest.raises(ProtocolError) as err:
        load_protocol(file)
    message = str(err.value)
    assert str(file) in message
    for word in words:
        assert word in message, message


def test_invalid_yaml_and_missing_file_are_protocol_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ProtocolError, match="invalid YAML"):
        load_protocol(bad)
    with pytest.raises(ProtocolError, match="cannot read"):
        load_protocol(tmp_path / "absent.yaml")


def test_hash_ignores_key_order_comments_whitespace_and_int_float_spelling(tmp_path):
    raw = fake_protocol_dict()
    first = load_protocol(write_protocol(tmp_path, raw, "a.yaml"))
    reordered = dict(reversed(list(copy.deepcopy(raw).items())))
    reordered["sampling"] = {"top_p": 0.95, "top_k": 8, "temperature": 1}  # 1 == 1.0 after parsing
    text = "# a comment\n\n" + write_protocol(tmp_path, reordered, "b.yaml").read_text().replace(": ", ":   ")
    (tmp_path / "b.yaml").write_text(text)
    assert load_protocol(tmp_path / "b.yaml").hash == first.hash


@pytest.mark.parametrize(
    "path,value",
    [
        (["alpha"], 0.02),
        (["prompt"], "abd"),
        (["sampling", "top_k"], 9),
        (["profiles", "ci", "samples_per_group"], 801),
        (["groups", 1, "draft_loops"], 1),
        (["tests", 0, "tol"], 1e-8),
    ],
)
def test_hash_changes_with_any_value(tmp_path, path, value):
    base = parse_protocol(fake_protocol_dict())
    assert parse_protocol(_mutated(path, value)).hash != base.hash


def test_profiles_override_scale_only_and_keep_the_hash():
    protocol = parse_protocol(fake_protocol_dict())
    ci = resolve(protocol, "ci")
    assert (protocol.samples_per_group, ci.samples_per_group, ci.profile) == (1200, 800, "ci")
    assert ci.hash == protocol.hash
    with pytest.raises(ProtocolError, match="'ci'"):
        resolve(protocol, "cj")


def test_registration_needs_freeze_or_exploratory(tmp_path):
    file = write_protocol(tmp_path, fake_protocol_dict(), frozen=False)
    protocol = load_protocol(file)
    assert protocols.registration(protocol, file) == protocols.NOT_FROZEN
    with pytest.raises(ProtocolError, match="not frozen.*--exploratory"):
        protocols.check_registered(protocol, file, exploratory=False)
    assert protocols.check_registered(protocol, file, exploratory=True) == protocols.NOT_FROZEN
    lock, digest = protocols.freeze(file)
    assert lock == tmp_path / "frozen.lock" and digest == protocol.hash
    assert protocols.check_registered(protocol, file, exploratory=False) == protocols.FROZEN
    changed = load_protocol(write_protocol(tmp_path, fake_protocol_dict(alpha=0.05), frozen=False))
    with pytest.raises(ProtocolError, match="changed since frozen") as err:
        protocols.check_registered(changed, file, exploratory=False)
    assert str(file) in str(err.value)
    assert protocols.check_registered(changed, file, exploratory=True) == protocols.CHANGED


def test_duplicate_key_is_refused_with_both_lines(tmp_path):
    text = write_protocol(tmp_path, fake_protocol_dict()).read_text()
    file = tmp_path / "dup.yaml"
    file.write_text(text.replace("positions: 2\n", "positions: 2\nalpha: 0.01\nalpha: 0.05\n"))
    lines = file.read_text().splitlines()
    first, second = (i + 1 for i, line in enumerate(lines) if line.startswith("alpha:"))
    with pytest.raises(ProtocolError) as err:
        load_protocol(file)
    assert (
        str(file) in str(err.value) and f"lines {first} and {second}" in str(err.value) and "'alpha'" in str(err.value)
    )


@pytest.mark.parametrize("key,value", [("alpha", ".inf"), ("min_expected", ".nan"), ("power", "-.inf")])
def test_non_finite_numbers_are_refused(tmp_path, key, value):
    text = write_protocol(tmp_path, fake_protocol_dict()).read_text()
    file = tmp_path / "inf.yaml"
    file.write_text(text + f"{key}: {value}\n")
    with pytest.raises(ProtocolError, match=f"{key}: expected a finite number"):
        load_protocol(file)


@pytest.mark.parametrize("name", ["t1_quadrature", "t2_fp32", "t3_fp32", "t2_bf16"])
def test_shipped_protocols_parse_with_both_profiles(name):
    protocol = load_protocol(REPO / "protocols" / f"{name}.yaml")
    assert protocol.name == name
    assert resolve(protocol, "full").samples_per_group == 20000
    assert 0 < resolve(protocol, "ci").samples_per_group < 20000


@pytest.mark.parametrize("name", ["t1_quadrature", "t2_fp32", "t3_fp32", "t2_bf16"])
def test_shipped_protocols_match_their_frozen_hash(name):
    # Pre-registration: a shipped protocol may only change together with `specval freeze`.
    file = REPO / "protocols" / f"{name}.yaml"
    assert protocols.registration(load_protocol(file), file) == protocols.FROZEN


# ---------------------------------------------------------------- fuzz: `specval validate` on mutated protocols

NASTY_NUMBERS = [
    0,
    -1,
    1,
    2,
    2**31,
    2**32 + 1,
    2**64,
    -(2**70),
    0.5,
    1.0,
    1e-300,
    -1e-300,
    5e-324,
    1e308,
    -1e308,
    float("inf"),
    float("nan"),
    1e-5,
    0.9999999999999999,
]
TEXT_EDITS = [
    "&a ",
    "*a",
    "*missing",
    ": ",
    "- ",
    "{",
    "[",
    "]",
    "!!binary AAAA",
    "!!python/object:os.system ",
    "!!set {a, b}",
    "2001-01-01",
    "<<: *a",
    "\t",
    "\x00",
    "? ",
    "|",
    "%YAML 1.1\n",
    "---\n",
    "\n  ",
]
FUZZ_EXAMPLES = 150  # derandomized: the same 150 protocols on every run
FUZZ_DEADLINE_S = 2.0  # per protocol, imports done; one validate takes ~10 ms, a bounded refusal < 0.1 s


def _paths(node, prefix=()):
    """Every key path of a parsed protocol (mappings and lists), the root excluded."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield prefix + (key,)
        yield from _paths(child, prefix + (key,))


def _nasty_values():
    from hypothesis import strategies as st

    deep = "x"
    for _ in range(40):
        deep = [deep]
    return st.one_of(
        st.sampled_from(NASTY_NUMBERS),
        st.integers(),
        st.floats(),
        st.text(max_size=8),
        st.none(),
        st.booleans(),
        st.just(deep),
        st.lists(st.integers(-3, 3), max_size=3),
        st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2),
    )


def _mutated_text(draw, base: dict) -> str:
    """A protocol with one to three structural edits (replace a value, delete or add a key), then
    maybe a text edit (an anchor, alias, tag, indentation or control character spliced in)."""
    from hypothesis import strategies as st

    raw = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(sorted(_paths(raw), key=repr) or [("name",)]))
        parent = raw
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=6))] = draw(_nasty_values())
        else:
            parent[path[-1]] = draw(_nasty_values())
    text = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
    if draw(st.booleans()):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(TEXT_EDITS)) + text[at:]
    return text


def test_fuzzed_protocols_give_one_line_and_exit_0_or_2_never_a_traceback(tmp_path):
    """Throws mutated protocols (a distribution, a quality and a performance one) at `specval
    validate` in process. Each must exit 0 (it still parses: "ok ...") or 2 with one line naming
    the file, never another code, an exception or a traceback, within FUZZ_DEADLINE_S (timed here, once
    a first validate has done the imports).
    Deterministic: hypothesis runs derandomized (fixed examples), so this never fails spuriously."""
    hypothesis = pytest.importorskip("hypothesis")
    from click.testing import CliRunner
    from hypothesis import strategies as st

    from specval.cli import main

    bases = [fake_protocol_dict()] + [yaml.safe_load((REPO / name).read_text()) for name in FUZZ_BASES]
    outcomes = {0: 0, 2: 0}
    assert CliRunner().invoke(main, ["validate", *(str(REPO / name) for name in FUZZ_BASES)]).exit_code == 0

    @hypothesis.settings(
        max_examples=FUZZ_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(st.data())
    def validate_one(data):
        text = _mutated_text(data.draw, data.draw(st.sampled_from(bases)))
        path = tmp_path / "fuzzed.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        start = time.perf_counter()
        result = CliRunner().invoke(main, ["validate", str(path)])
        assert time.perf_counter() - start < FUZZ_DEADLINE_S, text
        lines = result.output.strip().splitlines()
        assert result.exception is None or isinstance(result.exception, SystemExit), (text, result.exception)
        assert result.exit_code in outcomes and "Traceback" not in result.output, (text, result.output)
        assert len(lines) == 1 and lines[0].startswith("ok " if result.exit_code == 0 else f"error: {path}"), (
            text,
            result.output,
        )
        outcomes[result.exit_code] += 1

    validate_one()
    assert outcomes[2] > FUZZ_EXAMPLES // 2  # most mutations break the protocol: the fuzz reaches the refusals


FUZZ_BASES = ["protocols/quality_arith.yaml", "protocols/performance/perf_async_vs_serial_graphs_c1.yaml"]


SUITES = ("sampler_suite.yaml",)  # kind: suite lists protocols and has no sizes (tests/specval/test_suite.py)
SIZE_KEYS = ("samples_per_group", "sequences_per_group")  # distribution kind, sequence kind
CPU_PROTOCOLS = [
    p
    for p in sorted(REPO.glob("protocols/*.yaml")) + sorted(REPO.glob("protocols/suite/*.yaml"))
    if p.name not in SUITES
]


@pytest.mark.parametrize("file", CPU_PROTOCOLS, ids=lambda path: path.stem)
def test_every_shipped_cpu_protocol_has_a_smoke_profile_below_ci(file):
    """`specval run X --profile smoke` is an adapter author's first command (docs/harness.md section 9).
    Deterministic. GPU protocols are exempt (refused without a GPU); quality ones have their own sizes;
    the size of a sequence protocol is its sequences per group."""
    from specval.kinds import read_protocol_file

    protocol = read_protocol_file(file).load()
    size = next((key for key in SIZE_KEYS if hasattr(protocol, key)), None)
    if protocol.sut.device != "cpu" or size is None:
        return
    assert "smoke" in dict(protocol.profiles), f"{file.name} has no smoke profile"
    assert getattr(resolve(protocol, "smoke"), size) < getattr(resolve(protocol, "ci"), size)


def test_look_levels_below_what_monte_carlo_resolves_are_refused(tmp_path):
    raw = fake_protocol_dict(alpha=1e-5, sequential={"looks": [0.05, 1.0], "spending": "linear"})
    file = write_protocol(tmp_path, raw)
    with pytest.raises(ProtocolError) as err:
        load_protocol(file)
    for word in (str(file), "sequential.spending", "alpha = 1e-05", "5e-07", "below 1e-06", "'linear'"):
        assert word in str(err.value), str(err.value)


def test_sequential_enters_the_hash_only_when_present(tmp_path):
    """Deterministic: a protocol without looks hashes as before the key existed (its canonical form
    has no `sequential`); looks and spending each change the hash."""
    plain = load_protocol(write_protocol(tmp_path, fake_protocol_dict(), "a.yaml"))
    assert "sequential" not in plain.to_dict() and plain.sequential is None
    looks = {"looks": [0.25, 0.5, 1.0]}
    pocock = load_protocol(write_protocol(tmp_path, fake_protocol_dict(sequential=looks), "b.yaml"))
    explicit = load_protocol(
        write_protocol(tmp_path, fake_protocol_dict(sequential={**looks, "spending": "pocock"}), "c.yaml")
    )
    linear = load_protocol(
        write_protocol(tmp_path, fake_protocol_dict(sequential={**looks, "spending": "linear"}), "d.yaml")
    )
    assert pocock.sequential == protocols.SequentialSpec((0.25, 0.5, 1.0), "pocock")
    assert pocock.to_dict()["sequential"] == {"looks": [0.25, 0.5, 1.0], "spending": "pocock"}
    assert len({plain.hash, pocock.hash, linear.hash}) == 3 and explicit.hash == pocock.hash
    assert resolve(pocock, "ci").sequential == pocock.sequential and resolve(pocock, "ci").hash == pocock.hash
