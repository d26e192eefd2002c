"""Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied embeddings) in plain torch.

The model is a stack of identical layers. One layer step is a pure function of the hidden states,
their positions and an *attend* callable that owns the key/value storage:

    hidden = model.embed(token_ids)                                     # [T, H]
    for layer in range(first, stop):
        hidden = model.layer_step(layer, hidden, positions, attend)     # attend stores/reads K, V
    logits = model.readout(hidden)                                      # float32 [T, V]

`ContiguousAttention` is the reference `attend` (one sequence, keys kept in order); a paged KV cache
plugs in by supplying its own callable with the same signature. Early exit (the draft of a
non-looped model) is `readout` applied after the first `draft_layers` layers; the verify pass
continues from those hidden states, so every layer runs once per position.

Rotary convention: the projection rows of each head are in the "half-split" layout (dimension i
is rotated with dimension i + head_dim/2), the layout of the original checkpoints. Loaders of
llama.cpp files must undo llama.cpp's interleaving permutation first (see `engine.models.gguf`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from engine.models.attention import paged_attention
from engine.models.base import AttentionMetadata, PagedKV, ReplayResult

# attend(layer, q[T, Hq, D], k[T, Hkv, D], v[T, Hkv, D], positions[T]) -> out[T, Hq, D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and constants of a Llama-family model. Validated on construction."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float
    rms_norm_eps: float
    context_length: int
    tie_embeddings: bool
    bos_token_id: int
    eos_token_id: int

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "context_length",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"LlamaConfig.hidden_size={self.hidden_size} must split into "
                f"num_heads={self.num_heads} heads of even size"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"LlamaConfig.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ValueError(
                f"LlamaConfig.rope_theta={self.rope_theta!r} and rms_norm_eps={self.rms_norm_eps!r} must be > 0"
            )
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"LlamaConfig.{name}={value!r} is outside [0, {self.vocab_size})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer, torch.nn.Linear convention (weight[out, in])."""

    attn_norm: torch.Tensor  # [H]
    wq: torch.Tensor  # [num_heads * D, H], half-split rotary layout per head
    wk: torch.Tensor  # [num_kv_heads * D, H], half-split rotary layout per head
    wv: torch.Tensor  # [num_kv_heads * D, H]
    wo: torch.Tensor  # [H, num_heads * D]
    ffn_norm: torch.Tensor  # [H]
    w_gate: torch.Tensor  # [I, H]
    w_up: torch.Tensor  # [I, H]
    w_down: torch.Tensor  # [H, I]

    def expected_shapes(self, config: LlamaConfig) -> dict[str, tuple[int, ...]]:
        h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
        return {
            "attn_norm": (h,),
            "wq": (config.num_heads * d, h),
            "wk": (config.num_kv_heads * d, h),
            "wv": (config.num_kv_heads * d, h),
            "wo": (h, config.num_heads * d),
            "ffn_norm": (h,),
            "w_gate": (i, h),
            "w_up": (i, h),
            "w_down": (h, i),
        }


@dataclass(frozen=True)
class LlamaWeights:
    """All parameters. With tied embeddings `lm_head` is the same tensor object as `embed`."""

    embed: torch.Tensor  # [V, H]
    layers: tuple[LayerWeights, ...]  # num_layers entries
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]

    def validate(self, config: LlamaConfig) -> None:
        """Raise ValueError naming the first tensor whose shape disagrees with `config`."""
        v, h = config.vocab_size, config.hidden_size
        top = {"embed": (v, h), "final_norm": (h,), "lm_head": (v, h)}
        for name, shape in top.items():
            _check_shape(name, getattr(self, name), shape)
        if len(self.layers) != config.num_layers:
            raise ValueError(
                f"LlamaWeights.layers has {len(self.layers)} layers, config says num_layers={config.num_layers}"
            )
        for index, layer in enumerate(self.layers):
            for name, shape in layer.expected_shapes(config).items():
                _check_shape(f"layers[{index}].{name}", getattr(layer, name), shape)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> LlamaWeights:
        """A copy in `dtype` and on `device` (norm weights too); keeps the embedding/LM-head tie."""

        def move(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(device=device, dtype=dtype)

        embed = move(self.embed)
        lm_head = embed if self.lm_head is self.embed else move(self.lm_head)
        layers = tuple(
            replace(layer, **{f.name: move(getattr(layer, f.name)) for f in fields(layer)}) for layer in self.layers
        )
        return LlamaWeights(embed=embed, layers=layers, final_norm=move(self.final_norm), lm_head=lm_head)


def _check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"weight {name} has shape {tuple(tensor.shape)}, expected {shape}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight, normalised in float32 and cast back to x's dtype before scaling."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim] (float32) for the half-split rotary layout."""
    even = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float()
    inv_freq = 1.0 / (theta ** (even / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    angles = torch.cat([angles, angles], dim=-1)  # [T, D]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x[T, heads, D] by position: x * cos + rotate_half(x) * sin, in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :].to(x.dtype) + rotated * sin[:, None, :].to(x.dtype)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
) -> torch.Tensor:
    """Grouped-query attention of q[T, Hq, D] over k, v[S, Hkv, D]; query at p sees keys at <= p.

    Query head h reads key/value head h // (Hq // Hkv). Returns [T, Hq, D] in q's dtype.
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    visible = k_positions[None, :] <= q_positions[:, None]  # [T, S]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=visible)
    return out.transpose(0, 1)


class ContiguousAttention:
    """Reference `attend` for one sequence: appends each layer's keys/values in position order.

    Guarantee: after `layer_step` over positions 0..T-1 (in one call or several consecutive ones),
    `keys[layer]` / `values[layer]` hold the post-RoPE keys and the values of positions 0..T-1.
    """

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers  # each [S, Hkv, D]
        self.values: list[torch.Tensor | None] = [None] * num_layers  # each [S, Hkv, D]
        self.positions: list[torch.Tensor | None] = [None] * num_layers  # each int64[S]

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k])
            v = torch.cat([self.values[layer], v])
            positions_all = torch.cat([self.positions[layer], positions])
        else:
            positions_all = positions
        self.keys[layer], self.values[layer], self.positions[layer] = k, v, positions_all
        return causal_attention(q, k, v, positions, positions_all)

    def length(self, layer: int) -> int:
        return 0 if self.keys[layer] is None else int(self.keys[layer].shape[0])


FEW_ROWS = 8  # project(): up to this many rows, the CPU product runs with the weight untransposed


def project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x[T, in] @ weight[out, in]^T -> [T, out], contiguous; the same product as `F.linear(x, weight)`
    up to float rounding (each entry is one length-`in` dot product, summed in the BLAS's order).

    On the CPU with 2..FEW_ROWS rows it is computed as (weight @ x^T)^T: torch's CPU GEMM for a
    few rows against a transposed weight matrix streams that matrix from DRAM at 6-10 GB/s, the
    untransposed product at 27 GB/s for 2 rows, 17 for 5 and 12 for 8; from 10 rows on the
    default is as fast or faster (2-core x86-64, 1,536 x 576 fp32 matrices;
    `python -m benchmarks.cpu_matmul`). A served step of a small batch is a few rows. Elsewhere
    (CUDA, one row, many rows) it is `x @ weight.T`, so GPU numerics are unchanged. Rows are not
    batch-invariant either way: a row's value may depend on the number of rows (BLAS blocking).
    """
    if x.device.type == "cpu" and 2 <= x.shape[0] <= FEW_ROWS:
        return (weight @ x.T).T.contiguous()
    return x @ weight.T


class LlamaModel:
    """A Llama-family decoder over given weights; the dtype is the weights' dtype (fp32 or bf16)."""

    def __init__(self, config: LlamaConfig, weights: LlamaWeights):
        weights.validate(config)
        self.config = config
        self.weights = weights

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """int64[T] -> hidden[T, H]. Token ids outside the vocabulary -> ValueError."""
        if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= self.config.vocab_size):
            raise ValueError(
                f"token_ids must lie in [0, {self.config.vocab_size}), got "
                f"min={int(token_ids.min())} max={int(token_ids.max())}"
            )
        return self.weights.embed[token_ids]

    def layer_step(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """One decoder layer on hidden[T, H] at int64 positions[T]; `attend` owns the KV."""
        cfg, w = self.config, self.weights.layers[layer]
        num_tokens, d = hidden.shape[0], cfg.head_dim
        x = rms_norm(hidden, w.attn_norm, cfg.rms_norm_eps)
        q = project(x, w.wq).view(num_tokens, cfg.num_heads, d)
        k = project(x, w.wk).view(num_tokens, cfg.num_kv_heads, d)
        v = project(x, w.wv).view(num_tokens, cfg.num_kv_heads, d)
        cos, sin = rope_cos_sin(positions, d, cfg.rope_theta)
        attn = attend(layer, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, positions)
        hidden = hidden + project(attn.reshape(num_tokens, cfg.num_heads * d), w.wo)
        x = rms_norm(hidden, w.ffn_norm, cfg.rms_norm_eps)
        return hidden + project(F.silu(project(x, w.w_gate)) * project(x, w.w_up), w.w_down)

    def run_layers(
        self, hidden: torch.Tensor, positions: torch.Tensor, start: int, stop: int, attend: Attend
    ) -> torch.Tensor:
        """Layers start..stop-1 (0-based) in order."""
        if not 0 <= start <= stop <= self.config.num_layers:
            raise ValueError(f"layer range [{start}, {stop}) is outside [0, {self.config.num_layers}]")
        for layer in range(start, stop):
            hidden = self.layer_step(layer, hidden, positions, attend)
        return hidden

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden[T, H] -> float32 logits[T, V]: final RMSNorm then the LM head (valid after any layer)."""
        normed = rms_norm(hidden, self.weights.final_norm, self.config.rms_norm_eps)
        return project(normed, self.weights.lm_head).float()

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Reference full-depth forward of one sequence int64[T] -> float32 logits[T, V]."""
        return self.early_exit(token_ids, (self.config.num_layers,))[0]

    def early_exit(self, token_ids: torch.Tensor, depths: tuple[int, ...]) -> list[torch.Tensor]:
        """Logits read out after each layer count in `depths` (increasing, 1..num_layers): [T, V] each.

        One pass: layers between two depths run once, so the deeper readouts continue from the
        shallower hidden states exactly as a draft-then-verify round does.
        """
        self._check_depths(depths)
        self._check_length(token_ids)
        positions = torch.arange(token_ids.shape[0], device=token_ids.device)
        attend = ContiguousAttention(self.config.num_layers)
        hidden, done, logits = self.embed(token_ids), 0, []
        for depth in depths:
            hidden = self.run_layers(hidden, positions, done, depth, attend)
            logits.append(self.readout(hidden))
            done = depth
        return logits

    def greedy_continuation(
        self, token_ids: torch.Tensor, max_new_tokens: int, stop_token_ids: tuple[int, ...] = ()
    ) -> list[int]:
        """Reference greedy decoding (argmax, lowest index on ties) with the contiguous cache.

        Returns the generated ids, ending with a stop token if one was produced.
        """
        self._check_length(token_ids)
        if token_ids.shape[0] + max_new_tokens > self.config.context_length:
            raise ValueError(
                f"prompt of {token_ids.shape[0]} tokens + max_new_tokens={max_new_tokens} exceeds "
                f"context_length={self.config.context_length}"
            )
        attend, generated = ContiguousAttention(self.config.num_layers), []
        step_ids, start = token_ids, 0
        while len(generated) < max_new_tokens:
            positions = torch.arange(start, start + step_ids.shape[0], device=token_ids.device)
            hidden = self.run_layers(self.embed(step_ids), positions, 0, self.config.num_layers, attend)
            next_id = int(self.readout(hidden[-1:]).argmax(-1))
            generated.append(next_id)
            if next_id in stop_token_ids:
                break
            start += step_ids.shape[0]
            step_ids = torch.tensor([next_id], device=token_ids.device)
        return generated

    def _check_depths(self, depths: tuple[int, ...]) -> None:
        valid = all(1 <= d <= self.config.num_layers for d in depths)
        if not depths or not valid or list(depths) != sorted(set(depths)):
            raise ValueError(
                f"depths must be strictly increasing layer counts in [1, {self.config.num_layers}], got {depths!r}"
            )

    def _check_length(self, token_ids: torch.Tensor) -> None:
        if token_ids.dim() != 1 or token_ids.shape[0] > self.config.context_length:
            raise ValueError(
                f"token_ids must be 1-D with at most context_length="
                f"{self.config.context_length} tokens, got shape {tuple(token_ids.shape)}"
            )


class LlamaDepthModel:
    """Serves a `LlamaModel` through `engine.models.base.DepthModel`: one depth = a group of
    `layers_per_depth` consecutive layers, so a draft after d depths is the early exit after
    d * layers_per_depth layers, and the verify pass continues from its hidden states.

    The engine's paged attention expects as many key/value heads as query heads, so each layer's
    keys/values are expanded to the query heads (head h reads kv head h // group) before they are
    cached: `num_kv_heads` reports the expanded count. Exact, at group-times the KV memory.
    """

    def __init__(self, model: LlamaModel, layers_per_depth: int = 1):
        num_layers = model.config.num_layers
        if (
            isinstance(layers_per_depth, bool)
            or not isinstance(layers_per_depth, int)
            or layers_per_depth < 1
            or num_layers % layers_per_depth
        ):
            raise ValueError(
                f"layers_per_depth={layers_per_depth!r} must be a positive divisor of num_layers={num_layers}"
            )
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.num_layers_per_depth = layers_per_depth
        self.num_depths = num_layers // layers_per_depth
        self.num_kv_heads = model.config.num_heads
        self.head_size = model.config.head_dim
        self.eos_token_id = model.config.eos_token_id
        self._group = model.config.num_heads // model.config.num_kv_heads

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """int64[N] -> hidden[N, H], with no host synchronisation, so that a round can be captured
        in a CUDA Graph (`LlamaModel.embed` reads min/max back to name a bad id). Ids outside the
        vocabulary raise on the CPU and trip a device-side assert on CUDA, as `nn.Embedding` does
        in the looped model; the engine only embeds prompt ids checked at admission and sampled ids."""
        return F.embedding(token_ids, self.model.weights.embed)

    def forward_depth(
        self, depth: int, hidden: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata, kv: PagedKV
    ) -> torch.Tensor:
        """Layers of depth `depth` (1-based) on packed rows; writes their KV into `kv`'s pools."""
        self._check_depth(depth)
        first = (depth - 1) * self.num_layers_per_depth

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            index = layer - first
            return paged_attention(
                q,
                k.repeat_interleave(self._group, dim=1),
                v.repeat_interleave(self._group, dim=1),
                kv.key[index],
                kv.value[index],
                metadata,
            )

        return self.model.run_layers(hidden, positions, first, first + self.num_layers_per_depth, attend)

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.readout(hidden)

    @torch.no_grad()
    def replay(self, token_ids: torch.Tensor, num_depths: int) -> ReplayResult:
        """Serial cache-free evaluation (see DepthModel.replay); keys/values expanded to query heads."""
        self._check_depth(num_depths)
        self.model._check_length(token_ids)
        positions = torch.arange(token_ids.shape[0], device=token_ids.device)
        attend = ContiguousAttention(self.model.config.num_layers)
        hidden, logits = self.embed(token_ids), []
        for depth in range(1, num_depths + 1):
            first = (depth - 1) * self.num_layers_per_depth
            hidden = self.model.run_layers(hidden, positions, first, first + self.num_layers_per_depth, attend)
            logits.append(self.readout(hidden))
        layers = range(num_depths * self.num_layers_per_depth)
        keys = torch.stack([attend.keys[i].repeat_interleave(self._group, dim=1).float() for i in layers])
        values = torch.stack([attend.values[i].repeat_interleave(self._group, dim=1).float() for i in layers])
        shape = (num_depths, self.num_layers_per_depth) + tuple(keys.shape[1:])
        return ReplayResult(torch.stack(logits), keys.view(shape), values.view(shape))

    @torch.no_grad()
    def target_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """float32[T, V] after every layer (see DepthModel.target_logits): replay runs the same
        layer steps in the same order, so its last readout is this one bit for bit."""
        self.model._check_length(token_ids)
        positions = torch.arange(token_ids.shape[0], device=token_ids.device)
        hidden = self.model.run_layers(
            self.embed(token_ids),
            positions,
            0,
            self.model.config.num_layers,
            ContiguousAttention(self.model.config.num_layers),
        )
        return self.readout(hidden)

    def _check_depth(self, depth: int) -> None:
        if not 1 <= depth <= self.num_depths:
            raise ValueError(f"depth={depth!r} is invalid: expected 1..{self.num_depths}")
