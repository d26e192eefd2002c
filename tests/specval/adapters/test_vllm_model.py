"""Building the vllm adapter's model folders (a tiny random Llama; deterministic)."""

import json

import pytest

from specval.adapters import vllm_model
from tests.fixtures.tiny_llama import tiny_llama

transformers = pytest.importorskip("transformers", reason="the model build needs transformers (crosscheck extra)")


def test_truncated_draft_is_the_early_exit_of_the_target():
    """The first n layers, final norm and tied head: equal to the target's hidden state after n layers
    read out through its norm and head (fails if truncation kept, dropped or reordered a layer)."""
    import torch

    model = tiny_llama()
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        hidden = model.model(input_ids=ids, output_hidden_states=True).hidden_states[2]  # after 2 layers
        expected = model.lm_head(model.model.norm(hidden))
        got = vllm_model.truncate(model, 2)(input_ids=ids).logits
    assert model.config.num_hidden_layers == 2 and len(model.model.layers) == 2
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)  # same ops, same order: float32 equal


@pytest.mark.parametrize("layers", [0, 5])
def test_truncate_refuses_layer_counts_outside_the_model(layers):
    with pytest.raises(ValueError, match=f"--draft-layers: {layers} is not in 1..4"):
        vllm_model.truncate(tiny_llama(), layers)


def test_folders_and_build_record(tmp_path):
    record = vllm_model.BuildRecord(
        gguf="m.gguf", gguf_sha256="ab", num_hidden_layers=2, dtype="float32", transformers="5", torch="2"
    )
    model = tiny_llama(2)
    tokenizer = type("Tok", (), {"save_pretrained": lambda self, path: None})()
    vllm_model.save(model, tokenizer, vllm_model.draft_dir(tmp_path, 2), record)
    folder = tmp_path / "smollm2-L2"
    assert json.loads((folder / "build.json").read_text())["num_hidden_layers"] == 2
    assert vllm_model.read_build_record(folder)["gguf_sha256"] == "ab"
    assert vllm_model.read_build_record(tmp_path) is None
    assert (folder / "config.json").is_file() and vllm_model.target_dir(tmp_path) == tmp_path / "smollm2"
