"""Options, version guard and model folders of the vllm adapter (no vLLM needed; deterministic)."""

import pytest

from specval.adapters.vllm_options import (
    DRAFT_PROBABILISTIC,
    GroupMethod,
    VllmOptions,
    check_group_keys,
    check_version,
    group_where,
    models_root,
    require_folder,
)
from specval.sut import SUTError


def test_defaults_and_groups():
    options = VllmOptions.parse(
        (("groups", {"b": {"method": "ngram"}, "a": {"method": "draft_model", "draft_sample": "probabilistic"}}),)
    )
    assert options.patch_cpu_expand is False
    assert options.groups == (("a", GroupMethod("draft_model", DRAFT_PROBABILISTIC)), ("b", GroupMethod("ngram")))
    assert options.method_of("c") is None


@pytest.mark.parametrize(
    "options, match",
    [
        ((("patch", True),), r"unknown key\(s\) \['patch'\]"),
        ((("patch_cpu_expand", "yes"),), "patch_cpu_expand: 'yes'"),
        ((("groups", ["draft"]),), "sut.options.groups"),
        ((("groups", {"d": {"method": "eagle3"}}),), r"groups.d.method: 'eagle3'"),
        ((("groups", {"d": {"method": "draft_model", "k": 3}}),), r"groups.d: unknown key"),
        ((("groups", {"d": {"method": "draft_model", "draft_sample": "top"}}),), "draft_sample: 'top'"),
        ((("groups", {"n": {"method": "ngram", "draft_sample": "greedy"}}),), "draft_model only"),
    ],
)
def test_bad_options_name_the_key_and_value(options, match):
    with pytest.raises(SUTError, match=match):
        VllmOptions.parse(options)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu"])
def test_tested_versions_pass(version):
    check_version(version)


@pytest.mark.parametrize("version", ["0.31.1", "0.32.1", "0.33.0+cpu"])
def test_untested_versions_are_refused_naming_both(version):
    with pytest.raises(SUTError, match=rf"vLLM {version.replace('+', '.')} is not .*tested: 0\.32\.0"):
        check_version(version)


def test_models_root_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVAL_VLLM_MODELS", str(tmp_path))
    assert models_root() == tmp_path
    monkeypatch.delenv("SPECVAL_VLLM_MODELS")
    assert str(models_root()) == "models/vllm"


def test_missing_folder_names_it_and_the_build_command(tmp_path):
    with pytest.raises(SUTError, match=r"no model folder at .*python -m specval.adapters.vllm_model"):
        require_folder(tmp_path / "smollm2", "sut.model 'smollm2'")
    (tmp_path / "config.json").write_text("{}")
    assert require_folder(tmp_path, "x") == tmp_path


def test_engine_settings_default_to_the_adapters_and_parse_where_given():
    assert (VllmOptions().enable_prefix_caching, VllmOptions().max_num_seqs) == (False, None)
    options = VllmOptions.parse((("enable_prefix_caching", True), ("max_num_seqs", 8)), group_where("served"))
    assert (options.enable_prefix_caching, options.max_num_seqs) == (True, 8)


@pytest.mark.parametrize(
    "options, match",
    [
        ((("enable_prefix_caching", "on"),), r"^groups.g.options.enable_prefix_caching: 'on' is not true or false$"),
        ((("max_num_seqs", 0),), r"^groups.g.options.max_num_seqs: 0 is not an integer >= 1$"),
        ((("max_num_seqs", True),), r"^groups.g.options.max_num_seqs: True is not an integer >= 1$"),
    ],
)
def test_bad_engine_settings_name_the_group_the_key_and_the_value(options, match):
    with pytest.raises(SUTError, match=match):
        VllmOptions.parse(options, group_where("g"))


@pytest.mark.parametrize("key", ["patch_cpu_expand", "groups", "typo"])
def test_a_group_may_set_only_engine_settings(key):
    check_group_keys("g", (("enable_prefix_caching", True), ("max_num_seqs", 4)))
    with pytest.raises(SUTError, match=rf"^groups.g.options.{key}: 1 cannot be set per group .* in sut.options$"):
        check_group_keys("g", ((key, 1),))
