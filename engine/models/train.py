"""Train the default looped model on Python standard-library docstrings (reproducible, CPU).

    python -m engine.models.train [--steps 600] [--out engine/weights/looped-default]

Corpus: the docstrings (`inspect.getdoc`) of a fixed list of standard-library modules and of
their public classes and functions, in sorted order, as UTF-8 bytes, each document followed by
the end-of-sequence byte 0. The text therefore depends on the Python version, which is recorded
in the manifest next to the weights' sha256. Training: AdamW with a cosine schedule, the mean
cross-entropy over the readouts after every loop (so early exits are good drafts), fixed seeds.
Bitwise reproduction needs the same Python, torch and thread count; the manifest records them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import inspect
import json
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.models.loader import DEFAULT_WEIGHTS, WEIGHTS_DIR
from engine.models.looped import LoopedModel

CORPUS_MODULES = (
    "abc",
    "argparse",
    "array",
    "ast",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "enum",
    "fnmatch",
    "fractions",
    "functools",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "http.client",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "math",
    "operator",
    "os",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "sched",
    "secrets",
    "shlex",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "tokenize",
    "traceback",
    "types",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "warnings",
    "weakref",
    "xml.etree.ElementTree",
    "zipfile",
    "zlib",
)
EOS_BYTE = 0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 600
    batch_size: int = 32
    seq_len: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 30
    seed: int = 0
    num_threads: int = 2
    device: str = "cpu"


def corpus_bytes() -> bytes:
    """All docstrings, each terminated by EOS_BYTE, in a fixed order."""
    docs = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        docs.append(inspect.getdoc(module))
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isroutine(obj)):
                docs.append(inspect.getdoc(obj))
    seen, out = set(), bytearray()
    for doc in docs:
        if doc and doc not in seen:
            seen.add(doc)
            out += doc.encode("utf-8").replace(bytes([EOS_BYTE]), b"") + bytes([EOS_BYTE])
    return bytes(out)


def batches(data: torch.Tensor, config: TrainConfig, generator: torch.Generator):
    """Endless random windows int64[batch, seq_len + 1]."""
    while True:
        starts = torch.randint(0, data.numel() - config.seq_len - 1, (config.batch_size,), generator=generator)
        windows = torch.stack([data[s : s + config.seq_len + 1] for s in starts.tolist()])
        yield windows.to(config.device)


def depth_losses(model: LoopedModel, window: torch.Tensor) -> torch.Tensor:
    """float32[num_loops]: next-byte cross-entropy of the readout after each loop."""
    inputs, targets = window[:, :-1], window[:, 1:]
    return torch.stack(
        [F.cross_entropy(model.readout(h).flatten(0, 1), targets.flatten()) for h in model.forward_dense(inputs)]
    )


def learning_rate(step: int, config: TrainConfig) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress))


def train(model_config: ModelConfig, config: TrainConfig) -> tuple[LoopedModel, dict]:
    torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    data = torch.frombuffer(bytearray(corpus_bytes()), dtype=torch.uint8).long()
    split = int(0.95 * data.numel())
    model = LoopedModel.from_seed(model_config).to(config.device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    stream = batches(data[:split], config, torch.Generator().manual_seed(config.seed))
    start = time.time()
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        losses = depth_losses(model, next(stream))
        optimizer.zero_grad(set_to_none=True)
        losses.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == config.steps - 1:
            print(
                f"step {step:5d}  loss per loop {[round(x, 3) for x in losses.tolist()]}  {time.time() - start:.0f}s",
                flush=True,
            )
    model = model.cpu().eval()
    config = dataclasses.replace(config, device="cpu")
    with torch.no_grad():
        held_out = batches(data[split:], config, torch.Generator().manual_seed(config.seed + 1))
        eval_losses = torch.stack([depth_losses(model, next(held_out)) for _ in range(4)]).mean(0)
    info = {
        "corpus_bytes": int(data.numel()),
        "held_out_loss_per_loop": eval_losses.tolist(),
        "train_seconds": round(time.time() - start, 1),
    }
    return model, info


def save(model: LoopedModel, stem: Path, model_config: ModelConfig, config: TrainConfig, info: dict) -> None:
    weights = stem.with_suffix(".pt")
    torch.save({k: v.float().contiguous() for k, v in model.state_dict().items()}, weights)
    manifest = {
        "model_config": dataclasses.asdict(model_config),
        "train_config": dataclasses.asdict(config),
        "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": config.device,
        **info,
    }
    stem.with_suffix(".json").write_text(json.dumps(manifest, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR / DEFAULT_WEIGHTS)
    parser.add_argument("--device", default="cpu", help="cpu (reference) or cuda")
    args = parser.parse_args()
    config = TrainConfig(steps=args.steps, device=args.device)
    model_config = ModelConfig()
    model, info = train(model_config, config)
    save(model, args.out, model_config, config, info)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
