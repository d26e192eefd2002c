"""The looped transformer: prelude (embedding), a recurrent stack applied once per loop, coda.

Ouro-style: the same `num_layers` layers are applied `num_loops` times. Each loop is one depth
with its own KV entries; the coda (RMSNorm + LM head) reads out logits after any loop, so a draft
can stop after `draft_loops` loops and the verify pass continue from there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.models.attention import causal_attention, paged_attention, prefixed_attention
from engine.models.base import AttentionMetadata, PagedKV, ReplayResult


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).to(x.dtype) * self.weight


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate [..., T or N, heads, head] by position (rotate-half convention), in float32."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [..., T, half]
    cos, sin = angles.cos().unsqueeze(-2), angles.sin().unsqueeze(-2)
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class LoopedLayer(nn.Module):
    """Pre-norm attention + SwiGLU MLP. `attend(q, k, v)` supplies the attention backend."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.num_heads, self.head_size, self.theta = config.num_heads, config.head_size, config.rope_theta
        self.attn_norm = RMSNorm(hidden, config.norm_eps)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden, config.norm_eps)
        self.gate_up = nn.Linear(hidden, 2 * inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)

    def qkv_heads(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x[..., D] -> rotated q, rotated k, v, each [..., heads, head]."""
        q, k, v = self.qkv(self.attn_norm(x)).unflatten(-1, (3, self.num_heads, self.head_size)).unbind(-3)
        return rotary(q, positions, self.theta), rotary(k, positions, self.theta), v

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = x + self.out(attended.flatten(-2))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class LoopedModel(nn.Module):
    """Implements `engine.models.base.DepthModel`: one depth = one loop of the stack."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.vocab_size, self.num_depths = config.vocab_size, config.num_loops
        self.num_layers_per_depth = config.num_layers
        self.num_kv_heads, self.head_size = config.num_heads, config.head_size
        self.eos_token_id = config.eos_token_id
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LoopedLayer(config) for _ in range(config.num_layers))
        self.final_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def from_seed(cls, config: ModelConfig) -> LoopedModel:
        """Random weights, a pure function of `config.seed` (small normal init)."""
        generator = torch.Generator().manual_seed(config.seed)
        model = cls(config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if not name.endswith("norm.weight"):
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02 * _gain(name))
        return model.eval()

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(token_ids)

    def forward_depth(
        self, depth: int, hidden: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata, kv: PagedKV
    ) -> torch.Tensor:
        self._check_depth(depth)
        for index, layer in enumerate(self.layers):
            q, k, v = layer.qkv_heads(hidden, positions)
            attended = paged_attention(q, k, v, kv.key[index], kv.value[index], metadata)
            hidden = layer.finish(hidden, attended)
        return hidden

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.final_norm(hidden)).float()

    def forward_dense(self, token_ids: torch.Tensor) -> list[torch.Tensor]:
        """Training path: int64[B, T] -> hidden[B, T, D] after each loop (list of num_loops)."""
        positions = torch.arange(token_ids.shape[-1], device=token_ids.device)
        hidden, outputs = self.embed(token_ids), []
        for _ in range(self.num_depths):
            for layer in self.layers:
                q, k, v = layer.qkv_heads(hidden, positions)
                hidden = layer.finish(hidden, causal_attention(q, k, v))
            outputs.append(hidden)
        return outputs

    @torch.no_grad()
    def replay(self, token_ids: torch.Tensor, num_depths: int) -> ReplayResult:
        """Serial cache-free evaluation of one sequence int64[T] (see DepthModel.replay)."""
        self._check_depth(num_depths)
        positions = torch.arange(token_ids.shape[0], device=token_ids.device)
        hidden = self.embed(token_ids).unsqueeze(0)
        logits, keys, values = [], [], []
        for _ in range(num_depths):
            for layer in self.layers:
                q, k, v = layer.qkv_heads(hidden, positions)
                keys.append(k[0].float())
                values.append(v[0].float())
                hidden = layer.finish(hidden, causal_attention(q, k, v))
            logits.append(self.readout(hidden[0]))
        shape = (num_depths, self.num_layers_per_depth) + keys[0].shape
        return ReplayResult(torch.stack(logits), torch.stack(keys).view(shape), torch.stack(values).view(shape))

    @torch.no_grad()
    def target_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """float32[T, V] after every loop (see DepthModel.target_logits): replay's operations, in
        its order and shapes, without its per-loop readouts and key/value copies."""
        positions = torch.arange(token_ids.shape[0], device=token_ids.device)
        hidden = self.embed(token_ids).unsqueeze(0)
        for _ in range(self.num_depths):
            for layer in self.layers:
                q, k, v = layer.qkv_heads(hidden, positions)
                hidden = layer.finish(hidden, causal_attention(q, k, v))
        return self.readout(hidden[0])

    @torch.no_grad()
    def depth_logits_batch(self, prompt_ids: torch.Tensor, token_ids: torch.Tensor, depth: int) -> torch.Tensor:
        """float32[B, T + 1, V]: the readout after `depth` loops predicting every token after one
        shared prompt int64[P] (P >= 1): row b's first entry predicts the first token after the
        prompt, entry i + 1 the token after prompt + token_ids[b, :i + 1] (int64[B, T], T >= 0).
        Row b equals `replay(prompt + token_ids[b], depth).logits[-1][P - 1:]`, the same operations,
        up to the summation order of batched matmuls: the prompt runs once (its keys and values at
        every loop and layer kept) and every row's tokens attend to it and to their own past
        (`prefixed_attention`), so the prompt's work is done once, not once per row (the harness's
        batched replays, `LLM.target_logits_along_batch`)."""
        self._check_depth(depth)
        prompt = self.embed(prompt_ids).unsqueeze(0)
        rows = self.embed(token_ids)
        width = prompt_ids.shape[0]
        prompt_positions = torch.arange(width, device=prompt_ids.device)
        row_positions = torch.arange(width, width + token_ids.shape[-1], device=prompt_ids.device)
        for _ in range(depth):
            for layer in self.layers:
                q, k, v = layer.qkv_heads(prompt, prompt_positions)
                attended = prefixed_attention(*layer.qkv_heads(rows, row_positions), k, v)
                prompt = layer.finish(prompt, causal_attention(q, k, v))
                rows = layer.finish(rows, attended)
        first = self.readout(prompt[:, -1:]).expand(token_ids.shape[0], -1, -1)
        return torch.cat([first, self.readout(rows)], dim=1)

    def _check_depth(self, depth: int) -> None:
        if not 1 <= depth <= self.num_depths:
            raise ValueError(f"depth={depth!r} is invalid: expected 1..{self.num_depths}")


def _gain(name: str) -> float:
    """Output projections start smaller so that the residual stream stays stable over loops."""
    return 0.5 if name.endswith(("out.weight", "down.weight")) else 1.0
