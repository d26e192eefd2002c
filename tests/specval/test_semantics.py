"""Declared filter semantics: the float64 reference follows each documented semantics (checked by a
brute-force reading of the definitions on tied and untied logits), protocols pin them without
changing the hash of protocols that do not, a pin the adapter does not declare is refused before
any seed, and a run records and reports the semantics it tested against.

The two runs at the end use fixed seeds on the fake SUT: deterministic on a platform. Their
false-fail rate over seed choices: the PASS run has 2 gating p-valued families at alpha 0.01
(<= 0.02); the FAIL run tests a t1 law at TV 0.333 from the reference with 400 samples per group,
where the t1 GOF's power is > 1 - 1e-6 (chi-square non-centrality n * chi2 distance >= n * 4 TV^2
= 177 on <= 1 degree of freedom after pooling)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from click.testing import CliRunner

from specval import seeds
from specval.cli import main
from specval.distribution import runner
from specval.distribution.reference import transform
from specval.preflight import check_capabilities
from specval.protocol import ProtocolError, SamplingSpec, load_protocol
from specval.report.markdown import semantics_text
from specval.semantics import CHOICES, DEFAULT_SEMANTICS, FilterSemantics
from specval.sut import Capabilities
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import MisdeclaredTiedFakeSUT, TiedFakeSUT

ALL_SEMANTICS = [FilterSemantics(*values) for values in itertools.product(*CHOICES.values())]
SPECS = [
    SamplingSpec(1.0, 3, 1.0),
    SamplingSpec(1.0, -1, 0.6),
    SamplingSpec(0.7, 4, 0.8),
    SamplingSpec(1.3, 2, 0.5),
    SamplingSpec(1.0, 6, 0.3),
    SamplingSpec(2.0, 1, 0.9),
]
BOUNDARY_MARGIN = 1e-9  # a top-p boundary closer than this to a partial mass is decided by rounding: redraw
# Why 1e-9: the brute force and `transform` add at most V = 12 float64 probabilities in different
# orders; their sums differ by at most V * eps = 2.7e-15, far below the margin, so away from the
# margin both decide every top-p comparison alike, and the probabilities then agree to a few ulps.
PROB_ATOL = 1e-15  # both softmaxes exponentiate the same float64 values; the sums differ by <= V eps


def _brute_force(logits: np.ndarray, spec: SamplingSpec, semantics: FilterSemantics) -> np.ndarray:
    """The definitions of specval.semantics read literally: pairwise comparisons, O(V^2), no sorting."""
    x = logits.astype(np.float64) / spec.temperature
    vocab, alive = x.size, np.ones(x.size, bool)
    steps = ("k", "p") if semantics.order == "top_k_then_top_p" else ("p", "k")
    for step in steps:
        if step == "k" and 0 < spec.top_k < vocab:

            def ahead(i, alive=alive):  # the mask before this step
                return sum(
                    alive[j] and (x[j] > x[i] or (semantics.top_k_ties == "lowest_index" and x[j] == x[i] and j < i))
                    for j in range(vocab)
                )

            alive = np.array([alive[i] and ahead(i) < spec.top_k for i in range(vocab)])
        if step == "p" and spec.top_p < 1.0:
            probs = _softmax(x, alive)
            if semantics.top_p_crossing == "keep":
                inside = [probs[probs > v].sum() < spec.top_p for v in probs]
            else:
                inside = [probs[probs >= v].sum() < spec.top_p or v == probs.max() for v in probs]
            alive = alive & np.array(inside) & (probs > 0)
    return _softmax(x, alive)


def _softmax(x: np.ndarray, alive: np.ndarray) -> np.ndarray:
    w = np.where(alive, np.exp(x - x[alive].max()), 0.0)
    return w / w.sum()


def _near_boundary(logits: np.ndarray, spec: SamplingSpec) -> bool:
    """True iff some partial mass of some alive set the filters can reach lies within the margin of top_p."""
    if spec.top_p >= 1.0:
        return False
    x = logits / spec.temperature
    for k in {x.size, spec.top_k if spec.top_k > 0 else x.size}:
        kept = np.sort(x)[::-1][:k]
        probs = np.exp(kept - kept.max())
        masses = np.cumsum(np.sort(probs / probs.sum())[::-1])
        if np.min(np.abs(masses - spec.top_p)) < BOUNDARY_MARGIN:
            return True
    return False


def _cases(rng: np.random.Generator, spec: SamplingSpec, tied: bool, count: int = 25) -> list[np.ndarray]:
    cases = []
    while len(cases) < count:
        logits = rng.integers(-3, 4, 12).astype(np.float64) if tied else rng.standard_normal(12) * 2
        if not _near_boundary(logits, spec):
            cases.append(logits)
    return cases


@pytest.mark.parametrize("semantics", ALL_SEMANTICS, ids=lambda s: s.describe())
@pytest.mark.parametrize("tied", [True, False], ids=["integer_ties", "random"])
def test_transform_matches_brute_force_for_every_semantics(semantics, tied):
    rng = np.random.default_rng(11)
    for spec in SPECS:
        for logits in _cases(rng, spec, tied):
            ours = transform(logits, spec, semantics)
            np.testing.assert_allclose(
                ours, _brute_force(logits, spec, semantics), rtol=0, atol=PROB_ATOL, err_msg=f"{spec} {logits}"
            )
            assert np.count_nonzero(ours) >= 1


def test_each_choice_changes_the_law_where_it_should():
    logits = np.log(np.array([0.4, 0.2, 0.2, 0.1, 0.1]))
    lowest, drop = FilterSemantics(top_k_ties="lowest_index"), FilterSemantics(top_p_crossing="drop")
    assert np.count_nonzero(transform(logits, SamplingSpec(1.0, 2, 1.0))) == 3  # the tie at the 2nd value kept
    assert np.flatnonzero(transform(logits, SamplingSpec(1.0, 2, 1.0), lowest)).tolist() == [0, 1]
    assert np.count_nonzero(transform(logits, SamplingSpec(1.0, -1, 0.5))) == 3  # crossing token and its tie
    assert np.count_nonzero(transform(logits, SamplingSpec(1.0, -1, 0.5), drop)) == 1  # 0.4 + 0.2 + 0.2 >= 0.5
    assert np.count_nonzero(transform(logits, SamplingSpec(1.0, -1, 0.3), drop)) == 1  # the top token survives
    ordered = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    spec, reverse = SamplingSpec(1.0, 2, 0.5), FilterSemantics(order="top_p_then_top_k")
    assert np.count_nonzero(transform(ordered, spec)) == 1  # after top-k: 0.4 / 0.7 = 0.57 >= 0.5 before token 1
    assert np.count_nonzero(transform(ordered, spec, reverse)) == 2  # on the full softmax: 0.4 < 0.5


def test_semantics_values_are_checked():
    with pytest.raises(ValueError, match="top_k_ties"):
        FilterSemantics(top_k_ties="highest_index")
    with pytest.raises(ValueError, match="unknown field"):
        FilterSemantics.from_dict({"ties": "keep"})
    assert FilterSemantics.from_dict(DEFAULT_SEMANTICS.to_dict()) == DEFAULT_SEMANTICS
    with pytest.raises(ValueError, match="semantics"):
        Capabilities(semantics={"top_k_ties": "keep"})


# ---------------------------------------------------------------- protocols


def _pinned(tmp_path, pins: dict, **overrides):
    raw = fake_protocol_dict(**overrides)
    raw["sampling"] = {**raw["sampling"], "semantics": pins}
    return write_protocol(tmp_path, raw, frozen=False)


def test_a_pin_enters_the_hash_and_no_pin_leaves_it_as_before(tmp_path):
    plain = load_protocol(write_protocol(tmp_path, fake_protocol_dict(), "plain.yaml", frozen=False))
    assert "semantics" not in plain.to_dict()["sampling"]
    pinned = load_protocol(_pinned(tmp_path, {"top_k_ties": "lowest_index"}))
    assert pinned.sampling.semantics == (("top_k_ties", "lowest_index"),)
    assert pinned.hash != plain.hash
    default_pin = load_protocol(_pinned(tmp_path, {"top_k_ties": "keep"}))
    assert default_pin.hash not in (plain.hash, pinned.hash)  # pinning is a decision: it is registered


@pytest.mark.parametrize(
    "pins, words",
    [
        ({"top_k_tie": "keep"}, "sampling.semantics.top_k_tie: unknown key; did you mean 'top_k_ties'"),
        ({"order": "top_p_first"}, "sampling.semantics.order: must be one of"),
        ("keep", "sampling.semantics: expected a mapping"),
    ],
)
def test_bad_pins_name_the_key_and_the_value(tmp_path, pins, words):
    with pytest.raises(ProtocolError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_protocol(_pinned(tmp_path, pins))


def test_shipped_protocols_keep_their_frozen_hashes():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    files = sorted(repo.glob("protocols/*.yaml")) + sorted(repo.glob("protocols/suite/*.yaml"))
    result = CliRunner().invoke(main, ["validate", *map(str, files)])
    assert result.exit_code == 0 and "changed since frozen" not in result.output, result.output


def test_a_pin_the_adapter_does_not_declare_is_refused_before_any_seed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    file = _pinned(tmp_path, {"top_p_crossing": "keep", "top_k_ties": "lowest_index"})
    line = next(i + 1 for i, text in enumerate(file.read_text().splitlines()) if "top_k_ties:" in text)
    result = CliRunner().invoke(main, ["run", str(file), "--exploratory", "--quiet"])
    assert result.exit_code == 2, result.output
    assert f"{file}:{line}: sampling.semantics.top_k_ties" in result.output
    assert "semantics='top_k_ties=lowest_index'" in result.output and "top_k_ties=keep" in result.output
    assert not seeds.read_ledger(tmp_path / "results")
    protocol = load_protocol(file)
    check_capabilities(protocol, TiedFakeSUT, file)  # the adapter declaring lowest_index accepts the pin


# ---------------------------------------------------------------- runs

TIED = {
    "prompt": "abd",
    "sampling": {"temperature": 1.0, "top_k": 2, "top_p": 1.0},
    "samples_per_group": 400,
    "chunk_size": 200,
    "batch_size": 100,
    "profiles": {"ci": {"samples_per_group": 400}},
}
TV_AT_PROMPT = 0.333  # TV between the two top-k tie rules on the fake SUT's rounded row 4 ('d'), k = 2


def test_the_reference_follows_the_declared_semantics_and_the_report_prints_them(tmp_path):
    file = write_protocol(tmp_path, fake_protocol_dict(**TIED))
    sut = TiedFakeSUT(load_protocol(file).sut, 3)
    logits, spec = sut.target_logits(sut.encode("abd")), SamplingSpec(1.0, 2, 1.0)
    tv = 0.5 * np.abs(transform(logits, spec) - transform(logits, spec, sut.sampler_semantics)).sum()
    assert tv == pytest.approx(TV_AT_PROMPT, abs=1e-3)  # the precondition of the FAIL below
    path, summary = runner.run(file, "ci", tmp_path / "results", sut_factory=TiedFakeSUT, progress=False)
    assert summary["verdict"] == "PASS" and summary["semantics"]["top_k_ties"] == "lowest_index"
    line = "filter semantics: top_k_ties lowest_index, top_p_crossing keep, order top_k_then_top_p"
    assert semantics_text(summary) == line and f"- {line}" in (path / "report.md").read_text()
    assert line in (path / "report.html").read_text()
    assert runner.verify(path) == []
    _, wrong = runner.run(file, "ci", tmp_path / "results", sut_factory=MisdeclaredTiedFakeSUT, progress=False)
    assert wrong["verdict"] == "FAIL" and wrong["semantics"]["top_k_ties"] == "keep"


def test_a_resume_under_other_declared_semantics_is_refused(tmp_path):
    from specval import bundle as bundles

    plan = bundles.RunPlan("fake_t2", "0" * 64, "ci", (("nospec", 0, 10),))
    bundles.write_json(tmp_path / bundles.RUN_FILE, plan.to_dict())
    assert "semantics" not in plan.to_dict()  # a bundle that recorded none: started under the defaults
    runner.check_resumed_semantics(tmp_path, DEFAULT_SEMANTICS)
    with pytest.raises(ProtocolError, match="started under filter semantics"):
        runner.check_resumed_semantics(tmp_path, TiedFakeSUT.sampler_semantics)
    recorded = bundles.RunPlan(
        "fake_t2",
        "0" * 64,
        "ci",
        (("nospec", 0, 10),),
        semantics=tuple(TiedFakeSUT.sampler_semantics.to_dict().items()),
    )
    bundles.write_json(tmp_path / bundles.RUN_FILE, recorded.to_dict())
    runner.check_resumed_semantics(tmp_path, TiedFakeSUT.sampler_semantics)
    with pytest.raises(ProtocolError, match="top_k_ties keep"):
        runner.check_resumed_semantics(tmp_path, DEFAULT_SEMANTICS)
