"""The vllm adapter. The first tests need neither vLLM nor a model folder (deterministic); the
last ones drive vLLM itself and skip with a reason where it is not importable (the suite's venv:
vLLM lives in its own environment, scripts/test_vllm.sh runs them there)."""

import importlib.util

import numpy as np
import pytest

from specval.adapters import vllm as adapter
from specval.adapters import vllm_options
from specval.protocol import GroupSpec, SamplingSpec, SutSpec
from specval.sut import SUTError

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here (scripts/test_vllm.sh installs it "
                                                     "in its own virtual environment)")
DEFECT_MODULE = "vllm.v1.sample.ops.topk_topp_sampler"


def _spec(**options):
    return SutSpec(adapter="vllm", model="smollm2", options=tuple(sorted(options.items())))


@pytest.fixture
def models(tmp_path, monkeypatch):
    """A models root with an (empty) target folder, and a tested vLLM version reported."""
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / "config.json").write_text("{}")
    monkeypatch.setenv(vllm_options.MODELS_ENV, str(tmp_path))
    monkeypatch.setattr(adapter, "installed_version", lambda: "0.32.0")
    return tmp_path


def test_untested_version_is_refused_before_anything_loads(monkeypatch):
    monkeypatch.setattr(adapter, "installed_version", lambda: "0.31.0")
    with pytest.raises(SUTError, match=r"vLLM 0\.31\.0 is not a version .*tested: 0\.32\.0"):
        adapter.VllmSUT(_spec(), 4)


@pytest.mark.parametrize("field, value", [("dtype", "bfloat16"), ("device", "cuda"), ("model", "looped")])
def test_unsupported_sut_fields_name_field_and_value(models, field, value):
    spec = SutSpec(**{**dict(adapter="vllm", model="smollm2"), field: value})
    with pytest.raises(SUTError, match=rf"sut.{field}: '{value}'"):
        adapter.VllmSUT(spec, 4)


def test_check_groups_needs_a_method_per_speculative_group(models):
    sut = adapter.VllmSUT(_spec(groups={"ngram": {"method": "ngram"}}), 4)
    sut.check_groups((GroupSpec("nospec", "nospec"), GroupSpec("ngram", "sync")))
    with pytest.raises(SUTError, match=r"group 'draft': sut.options.groups.draft.method is required"):
        sut.check_groups((GroupSpec("draft", "sync"), GroupSpec("ngram", "sync")))
    with pytest.raises(SUTError, match="mode 'async'"):
        sut.check_groups((GroupSpec("ngram", "async"),))
    with pytest.raises(SUTError, match="draft_loops 3 does not apply to ngram"):
        sut.check_groups((GroupSpec("ngram", "sync", draft_loops=3),))


def test_check_groups_refuses_options_for_absent_groups(models):
    sut = adapter.VllmSUT(_spec(groups={"typo": {"method": "ngram"}}), 4)
    with pytest.raises(SUTError, match="sut.options.groups.typo: no speculative group"):
        sut.check_groups((GroupSpec("ngram", "sync"),))


def test_draft_model_folders(models):
    sut = adapter.VllmSUT(_spec(groups={"self": {"method": "draft_model"}, "cut": {"method": "draft_model"}}), 4)
    kwargs = sut.engine_kwargs(GroupSpec("self", "sync"))
    assert kwargs["speculative_config"]["model"] == str(models / "smollm2")  # the target as its own draft
    assert kwargs["speculative_config"]["draft_sample_method"] == "greedy"
    assert kwargs["enable_chunked_prefill"] is False and kwargs["dtype"] == "float32"
    with pytest.raises(SUTError, match=r"draft_loops 6: no model folder at .*smollm2-L6"):
        sut.engine_kwargs(GroupSpec("cut", "sync", draft_loops=6))
    assert "speculative_config" not in sut.engine_kwargs(GroupSpec("nospec", "nospec"))


def test_describe_says_whether_the_sut_was_patched(models, monkeypatch):
    sut = adapter.VllmSUT(_spec(), 4)
    assert sut.describe()["patched"] is False
    monkeypatch.setattr(adapter.VllmSUT, "_apply_patch", lambda self: "replaced X by Y")
    sut = adapter.VllmSUT(_spec(patch_cpu_expand=True), 4)
    assert sut.describe()["patched"] == "replaced X by Y"


def _raise_inside_vllm():
    """An exception raised by a function whose module is vLLM's (as vLLM's sampler raises it)."""
    namespace = {"__name__": DEFECT_MODULE}
    exec("def apply_top_k_top_p_pytorch():\n    raise RuntimeError('index -5 is out of bounds')", namespace)
    try:
        try:
            namespace["apply_top_k_top_p_pytorch"]()
        except RuntimeError as err:
            raise RuntimeError("EngineCore encountered an issue") from err
    except RuntimeError as err:
        return err


def test_failure_names_vllms_innermost_function_and_the_known_defect():
    line = adapter.vllm_failure(_raise_inside_vllm())
    assert line.startswith("vLLM raised RuntimeError: EngineCore encountered an issue")
    assert f"in {DEFECT_MODULE}.apply_top_k_top_p_pytorch" in line
    assert "patch_cpu_expand: true" in line and "\n" not in line


def test_failure_outside_vllm_names_no_function():
    assert adapter.vllm_failure(ValueError("x")) == "vLLM raised ValueError: x"


# -- with vLLM ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live():
    """The adapter on the built models folder (skips if it is missing), with the patch applied."""
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed here")
    if not (vllm_options.models_root() / "smollm2" / "config.json").is_file():
        pytest.skip("no model folder: python -m specval.adapters.vllm_model")
    sut = adapter.VllmSUT(_spec(patch_cpu_expand=True, groups={"draft": {"method": "draft_model"}}), 2)
    yield sut
    sut.close()


SAMPLING = SamplingSpec(temperature=1.0, top_k=20, top_p=0.95)


@needs_vllm
def test_live_seed_replay_is_independent_of_the_batch(live):
    """Deterministic: float32 gives the same tokens for a seed alone and inside a larger batch."""
    group = GroupSpec("draft", "sync")
    prompt = live.encode("Once upon a time")
    batch = live.sample(group, prompt, SAMPLING, np.arange(10, 18), 4, 6)
    alone = live.sample(group, prompt, SAMPLING, np.array([13, 11]), 4, 6)
    assert np.array_equal(alone.tokens, batch.tokens[[3, 1]])
    assert batch.sources[:, 0].tolist() == ["plain"] * 8  # t1 comes from the prefill
    assert set(batch.sources[:, 1]) <= {"accepted", "correction"}
    assert (batch.num_accepted_tokens <= batch.num_draft_tokens).all() and batch.num_rounds.min() >= 1
    assert len(set(map(tuple, batch.tokens))) > 1  # distinct seeds give distinct streams


@needs_vllm
def test_live_reference_is_the_served_model(live):
    """Deterministic: transformers' logits on the folder rank the tokens vLLM samples at t1 first:
    every sampled t1 lies within the reference's top 20 (the protocol's top_k), which fails if the
    reference read other weights or another tokenisation."""
    prompt = live.encode("Once upon a time")
    top = set(np.argsort(live.target_logits(prompt))[-20:].tolist())
    batch = live.sample(GroupSpec("nospec", "nospec"), prompt, SAMPLING, np.arange(100, 132), 1, 1)
    assert set(batch.tokens[:, 0].tolist()) <= top
