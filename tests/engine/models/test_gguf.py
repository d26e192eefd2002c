"""GGUF loading on small files written here with the `gguf` package (no model download needed).

Deterministic (seeded numpy weights): no false-fail rate beyond the stated quantisation bounds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the 'gguf' package (real-model extra) is not installed")

from engine.models.gguf import GGUFError, load_llama, packaged_file, permute_rotary, unpermute_rotary  # noqa: E402
from engine.models.llama import LayerWeights, LlamaModel, LlamaWeights  # noqa: E402
from tests.fixtures.engine_helpers import reorder_atol  # noqa: E402

Q = gguf.GGMLQuantizationType
V, H, INTER, L, HEADS, KV_HEADS = 64, 32, 64, 2, 4, 2
D = H // HEADS
# Worst-case |dequantised - original| for values in [-1, 1]: one quantisation step (the clipped end of
# the symmetric formats can be off by a full step), with a small margin.
TOLERANCE = {
    Q.F32: 0.0,
    Q.F16: 1e-3,
    Q.BF16: 8e-3,
    Q.Q8_0: 8e-3,
    Q.Q5_0: 0.07,
    Q.Q5_1: 0.07,
    Q.Q4_0: 0.13,
    Q.Q4_1: 0.13,
}
MIXED_TYPES = {
    "token_embd": Q.Q8_0,
    "attn_q": Q.Q4_1,
    "attn_k": Q.F16,
    "attn_v": Q.Q5_0,
    "attn_output": Q.Q4_0,
    "ffn_gate": Q.Q5_1,
    "ffn_up": Q.BF16,
    "ffn_down": Q.Q8_0,
}
LAYER_FIELDS = {
    "attn_norm": "attn_norm",
    "attn_q": "wq",
    "attn_k": "wk",
    "attn_v": "wv",
    "attn_output": "wo",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "w_gate",
    "ffn_up": "w_up",
    "ffn_down": "w_down",
}


def original_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Half-split (checkpoint-layout) weights in [-1, 1], torch shapes, keyed by GGUF name."""
    rng = np.random.default_rng(seed)
    shapes = {
        "attn_norm": (H,),
        "attn_q": (HEADS * D, H),
        "attn_k": (KV_HEADS * D, H),
        "attn_v": (KV_HEADS * D, H),
        "attn_output": (H, HEADS * D),
        "ffn_norm": (H,),
        "ffn_gate": (INTER, H),
        "ffn_up": (INTER, H),
        "ffn_down": (H, INTER),
    }
    arrays = {"token_embd.weight": rng.uniform(-1, 1, (V, H)), "output_norm.weight": 1 + rng.uniform(-0.1, 0.1, H)}
    for layer in range(L):
        for name, shape in shapes.items():
            arrays[f"blk.{layer}.{name}.weight"] = rng.uniform(-1, 1, shape) * (1 if len(shape) == 2 else 0.1) + (
                1 if len(shape) == 1 else 0
            )
    return {name: value.astype(np.float32) for name, value in arrays.items()}


def write_gguf(
    path: Path, arrays: dict[str, np.ndarray], types: dict[str, Q], arch: str = "llama", skip_keys: tuple[str, ...] = ()
) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    keys = {
        "block_count": L,
        "context_length": 128,
        "embedding_length": H,
        "feed_forward_length": INTER,
        "head_count": HEADS,
        "head_count_kv": KV_HEADS,
        "layer_norm_rms_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    for key, value in keys.items():
        if key not in skip_keys:
            getattr(writer, f"add_{key}")(value)
    writer.add_rope_freq_base(10000.0)
    for name, array in arrays.items():
        kind = next((t for part, t in types.items() if f"{part}." in name), Q.F32)
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = HEADS if "attn_q" in name else KV_HEADS
            array = permute_rotary(torch.from_numpy(array), heads).numpy()  # what llama.cpp's converter does
        if kind == Q.F32:
            writer.add_tensor(name, array)
        elif kind == Q.F16:
            writer.add_tensor(name, array.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def loaded_arrays(weights: LlamaWeights) -> dict[str, torch.Tensor]:
    out = {"token_embd.weight": weights.embed, "output_norm.weight": weights.final_norm}
    for index, layer in enumerate(weights.layers):
        out.update({f"blk.{index}.{name}.weight": getattr(layer, field) for name, field in LAYER_FIELDS.items()})
    return out


def test_rotary_permutation_round_trips_and_interleaves():
    w = torch.arange(2 * 8 * 3, dtype=torch.float32).view(16, 3)  # 2 heads of D=8, 3 input features
    permuted = permute_rotary(w, 2)
    assert torch.equal(unpermute_rotary(permuted, 2), w)  # a permutation of rows: exact
    # llama.cpp row 2i of a head holds original row i, row 2i+1 holds original row i + D/2.
    assert permuted[:8, 0].tolist() == [0, 12, 3, 15, 6, 18, 9, 21]


def test_f32_file_loads_exact_weights_and_forward(tmp_path):
    arrays = original_arrays()
    config, weights = load_llama(write_gguf(tmp_path / "f32.gguf", arrays, {}))
    assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == (
        V,
        H,
        L,
        HEADS,
        KV_HEADS,
    )
    assert config.tie_embeddings and weights.lm_head is weights.embed
    for name, value in loaded_arrays(weights).items():
        assert torch.equal(value, torch.from_numpy(arrays[name])), name
    direct = LlamaWeights(
        embed=torch.from_numpy(arrays["token_embd.weight"]),
        final_norm=torch.from_numpy(arrays["output_norm.weight"]),
        lm_head=torch.from_numpy(arrays["token_embd.weight"]),
        layers=tuple(
            LayerWeights(**{f: torch.from_numpy(arrays[f"blk.{i}.{n}.weight"]) for n, f in LAYER_FIELDS.items()})
            for i in range(L)
        ),
    )
    ids = torch.tensor([1, 5, 9, 33, 2])
    expected = LlamaModel(config, direct).forward(ids)
    # bitwise-equal weights in other tensors: a kernel may still pick another summation order
    # for another memory alignment, so the reorder bound (9 reductions per layer, readout 2)
    atol = reorder_atol(float(expected.abs().max()), num_reductions=9 * L + 2, max_terms=max(H, INTER))
    torch.testing.assert_close(LlamaModel(config, weights).forward(ids), expected, atol=atol, rtol=0)


def test_quantised_types_dequantise_within_their_step(tmp_path):
    arrays = original_arrays(seed=1)
    _, weights = load_llama(write_gguf(tmp_path / "mixed.gguf", arrays, MIXED_TYPES))
    for name, value in loaded_arrays(weights).items():
        kind = next((t for part, t in MIXED_TYPES.items() if f"{part}." in name), Q.F32)
        error = float((value - torch.from_numpy(arrays[name])).abs().max())
        assert error <= TOLERANCE[kind], (name, kind.name, error)
        assert kind == Q.F32 or error > 0, (name, "quantisation left no trace: wrong tensor compared?")


def test_bf16_load(tmp_path):
    _, weights = load_llama(write_gguf(tmp_path / "m.gguf", original_arrays(), {}), dtype=torch.bfloat16)
    assert weights.embed.dtype == weights.layers[0].wq.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "case, match",
    [
        ("architecture", "general.architecture='gpt2'"),
        ("unsupported_type", "blk.0.ffn_up.weight has type F64"),
        ("missing_tensor", "missing tensors \\['blk.1.ffn_down.weight'\\]"),
        ("unknown_tensor", "unknown tensors \\['rope_freqs.weight'\\]"),
        ("bad_shape", "tensor blk.0.attn_v.weight has shape"),
        ("missing_key", "llama.context_length"),
    ],
)
def test_bad_files_raise_errors_naming_file_and_cause(tmp_path, case, match):
    arrays, skip = original_arrays(), ()
    if case == "unsupported_type":
        arrays["blk.0.ffn_up.weight"] = arrays["blk.0.ffn_up.weight"].astype(np.float64)
    elif case == "missing_tensor":
        del arrays["blk.1.ffn_down.weight"]
    elif case == "unknown_tensor":
        arrays["rope_freqs.weight"] = np.ones(D // 2, dtype=np.float32)
    elif case == "bad_shape":
        arrays["blk.0.attn_v.weight"] = arrays["blk.0.attn_v.weight"][:8]
    elif case == "missing_key":
        skip = ("context_length",)
    if case == "architecture":
        path = write_gguf(tmp_path / "arch.gguf", arrays, {}, arch="gpt2")
    else:
        path = write_gguf(tmp_path / f"{case}.gguf", arrays, {}, skip_keys=skip)
    with pytest.raises(GGUFError, match=match) as info:
        load_llama(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("cut", [0, 10, 2000, -100])
def test_truncated_or_foreign_files_raise_gguf_error(tmp_path, cut):
    data = write_gguf(tmp_path / "full.gguf", original_arrays(), {}).read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    with pytest.raises(GGUFError, match="cut.gguf"):
        load_llama(path)


def test_foreign_and_missing_files(tmp_path):
    foreign = tmp_path / "notes.gguf"
    foreign.write_text("this is not a GGUF file at all")
    with pytest.raises(GGUFError, match="notes.gguf is corrupt"):
        load_llama(foreign)
    with pytest.raises(GGUFError, match="absent.gguf does not exist"):
        load_llama(tmp_path / "absent.gguf")


def test_missing_distribution_is_named():
    with pytest.raises(ModuleNotFoundError, match="no-such-model-package"):
        packaged_file("no-such-model-package", ".gguf")


@pytest.fixture(scope="module")
def smollm2():
    from engine.models.gguf import load_smollm2

    try:
        return load_smollm2()
    except ModuleNotFoundError as error:
        pytest.skip(str(error))


def test_packaged_smollm2_loads_as_engine_model(smollm2):
    from engine.models.gguf import SMOLLM2_LAYERS_PER_DEPTH

    cfg = smollm2.model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (49152, 576, 1536, 30)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.rope_theta, cfg.tie_embeddings) == (9, 3, 100000.0, True)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.context_length) == (1, 2, 8192)
    assert smollm2.num_depths * SMOLLM2_LAYERS_PER_DEPTH == 30 and smollm2.num_kv_heads == 9
    with pytest.raises(ValueError, match="context_length=8192"):
        smollm2.model.forward(torch.zeros(8193, dtype=torch.int64))


def test_engine_generates_with_smollm2(smollm2):
    """The real model through the engine with its own tokenizer: greedy sync speculation (draft
    after 24 layers) reproduces the reference greedy decoding (nospec is covered on small models)."""
    from engine import LLM, EngineConfig, SamplingParams
    from engine.models.gguf import SMOLLM2_DRAFT_DEPTH, smollm2_path
    from engine.tokenizer_gguf import GGUFTokenizer

    tokenizer = GGUFTokenizer.from_gguf(smollm2_path())
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}])
    expected = smollm2.model.greedy_continuation(torch.tensor(tokenizer.encode(prompt)), 6)
    config = EngineConfig(
        mode="sync", draft_loops=SMOLLM2_DRAFT_DEPTH, num_speculative_tokens=3, num_kv_blocks=64, block_size=16
    )
    llm = LLM(config, model=smollm2, tokenizer=tokenizer)
    output = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    llm.close()
    assert output.token_ids == expected
    assert output.num_draft_tokens > 0


def test_a_file_is_parsed_once_until_it_changes(tmp_path):
    """read_gguf keeps its parse (the model and its tokenizer read one file); a rewritten file is
    parsed again, so no caller sees stale metadata."""
    from engine.models.gguf import read_gguf

    path = write_gguf(tmp_path / "model.gguf", original_arrays(0), {})
    first = read_gguf(path)
    assert read_gguf(str(path)) is first
    write_gguf(path, original_arrays(1), {}, skip_keys=("context_length",))
    second = read_gguf(path)
    assert second is not first
    assert "llama.context_length" in first.metadata and "llama.context_length" not in second.metadata
