"""Building the served model: committed default weights, or random weights from a seed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from engine.config import EngineConfig, ModelConfig
from engine.models.looped import LoopedModel

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"
DEFAULT_WEIGHTS = "looped-default"  # <name>.pt (fp32 state_dict) + <name>.json (config, sha256)


def build_model(config: EngineConfig) -> LoopedModel:
    """The model of `config`, in its dtype and on its device, in eval mode."""
    if config.model_config is None:
        model = load_weights(WEIGHTS_DIR / DEFAULT_WEIGHTS)
    else:
        model = LoopedModel.from_seed(config.model_config)
    return model.to(device=config.device, dtype=config.torch_dtype).eval()


def load_weights(stem: Path) -> LoopedModel:
    """Load `<stem>.pt` after checking it against the sha256 recorded in `<stem>.json`."""
    weights, manifest = stem.with_suffix(".pt"), stem.with_suffix(".json")
    if not weights.exists() or not manifest.exists():
        raise FileNotFoundError(f"missing {weights.name} or {manifest.name} in {stem.parent}; "
                                "train them with `python -m engine.models.train`")
    meta = json.loads(manifest.read_text())
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    if digest != meta["sha256"]:
        raise ValueError(f"{weights.name} has sha256 {digest}, expected {meta['sha256']}")
    model = LoopedModel(ModelConfig(**meta["model_config"]))
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval()
