"""Reference: exact conditional target distributions by serial replay of the target model.

The sampling transform is implemented here in float64 numpy, independently of any engine:

1. divide the logits by the temperature;
2. apply top-k (k >= 1; disabled by 0, -1 or k >= V) and top-p (0 < p <= 1; disabled at 1) in
   the declared order, each with its declared tie / crossing rule (`specval.semantics`); top-p
   reads the softmax of the tokens still alive, top-k ranks only the tokens still alive;
3. softmax over the kept tokens; every other token has probability exactly 0.

With the default semantics: top-k keeps x iff fewer than k tokens have a strictly larger logit
(every tie at the k-th value survives); then top-p keeps x iff the total probability of tokens
with strictly larger probability is < p (the crossing token and its ties). No rule ever empties a
row. Guarantee: `transform` equals the contract of ARCHITECTURE.md section 2 (with the declared
semantics) evaluated in float64; an engine working in float32 may differ near a top-p boundary
or on float32-rounded ties, which the conformance test of the engine documents.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specval.protocol import SamplingSpec
from specval.semantics import CROSSING_DROP, DEFAULT_SEMANTICS, TIES_LOWEST_INDEX, TOP_K_THEN_TOP_P, FilterSemantics
from specval.sut import DRAFT_GREEDY, DRAFT_TEMPERATURE

Prefix = tuple[int, ...]
# reference.json's binary fields (bundle format 3): base64 of little-endian arrays
PROBS_DTYPE = np.dtype("<f8")
TOKENS_DTYPE = np.dtype("<i4")


def _top_k_mask(logits: np.ndarray, top_k: int, ties: str, alive: np.ndarray) -> np.ndarray:
    """keep[x] among the `alive` tokens of each row: ranked by logit (module doc, `top_k_ties`)."""
    vocab = logits.shape[-1]
    if top_k <= 0 or top_k >= vocab:
        return alive.copy()
    ranked = logits if alive.all() else np.where(alive, logits, -np.inf)  # [N, V] dead tokens rank last
    if ties == TIES_LOWEST_INDEX:
        keep = np.zeros_like(alive)
        order = np.argsort(-ranked, axis=-1, kind="stable")[:, :top_k]  # stable: lower id first among ties
        np.put_along_axis(keep, order, True, axis=-1)
        return keep & alive
    kth = np.partition(ranked, vocab - top_k, axis=-1)[..., vocab - top_k : vocab - top_k + 1]  # [N, 1] k-th largest
    return (ranked >= kth) & alive


def _softmax(logits: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Softmax of each row over its kept tokens (every row keeps one at least); exactly 0 elsewhere,
    since exp(-inf) = 0. In place on one array: memory passes are this function's whole cost."""
    weights = np.where(keep, logits, -np.inf)
    weights -= weights.max(axis=-1, keepdims=True)
    np.exp(weights, out=weights)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights


def _top_p_mask(probs: np.ndarray, top_p: float, crossing: str) -> np.ndarray:
    """keep[x] row-wise, by value: `keep` iff the mass of probs strictly larger than probs[x] is
    < top_p; `drop` iff the mass of probs >= probs[x] is < top_p or probs[x] is the row's maximum."""
    if top_p >= 1.0:
        return probs > 0.0
    desc = -np.sort(-probs, axis=-1)  # [N, V]
    through = np.cumsum(desc, axis=-1)  # [N, V] mass up to and including each sorted slot
    keep = np.empty_like(probs, dtype=bool)
    for row in range(probs.shape[0]):
        if crossing == CROSSING_DROP:
            last = np.searchsorted(-desc[row], -probs[row], side="right") - 1  # last slot holding the value
            inside = (through[row, last] < top_p) | (probs[row] == desc[row, 0])
        else:
            first = np.searchsorted(-desc[row], -probs[row], side="left")  # first slot holding the value
            inside = (through[row, first] - desc[row, first]) < top_p
        keep[row] = inside & (probs[row] > 0.0)
    return keep


def transform(logits: np.ndarray, sampling: SamplingSpec, semantics: FilterSemantics = DEFAULT_SEMANTICS) -> np.ndarray:
    """Sampling distribution(s) in float64 for logits f[..., V] under `semantics`; returns f64[..., V]
    rows summing to 1."""
    shape = np.shape(logits)
    rows = np.array(logits, dtype=np.float64).reshape(-1, shape[-1])  # [N, V], a copy
    rows /= sampling.temperature
    alive = np.ones_like(rows, dtype=bool)
    top_k_first = semantics.order == TOP_K_THEN_TOP_P
    for step in ("top_k", "top_p") if top_k_first else ("top_p", "top_k"):
        if step == "top_k":
            alive = _top_k_mask(rows, sampling.top_k, semantics.top_k_ties, alive)
        else:
            alive &= _top_p_mask(_softmax(rows, alive), sampling.top_p, semantics.top_p_crossing)
    return _softmax(rows, alive).reshape(shape)


def draft_law(
    draft_logits: np.ndarray, sampling: SamplingSpec, semantics: FilterSemantics, draft_kind: str
) -> np.ndarray:
    """q f64[V], the law a SUT drafts from, by its declared draft kind (`specval.sut.DRAFT_KINDS`):
    `filtered`: `transform` with the protocol's temperature, top-k and top-p; `temperature`: the
    softmax of logits / T, no truncation; `greedy`: the point mass at the argmax of the logits
    (lowest token id among tied maxima)."""
    logits = np.asarray(draft_logits, dtype=np.float64)
    if draft_kind == DRAFT_GREEDY:
        return point_mass(int(np.argmax(logits)), logits.shape[-1])
    if draft_kind == DRAFT_TEMPERATURE:
        return transform(logits, SamplingSpec(temperature=sampling.temperature), semantics)
    return transform(logits, sampling, semantics)


def point_mass(token: int, vocab_size: int) -> np.ndarray:
    """f64[V]: probability 1 at `token`."""
    law = np.zeros(vocab_size, dtype=np.float64)
    law[token] = 1.0
    return law


@dataclass(frozen=True)
class Reference:
    """Exact p(t_k | prompt, t_1..t_{k-1}) for every needed prefix, float64, dense over V."""

    vocab_size: int
    prompt_token_ids: tuple[int, ...]
    dists: Mapping[Prefix, np.ndarray]  # prefix -> f64[V]

    def probs(self, prefix: Sequence[int]) -> np.ndarray:
        return self.dists[tuple(int(t) for t in prefix)]

    def to_dict(self) -> dict:
        """JSON form (bundle format 3), exact: per prefix, `probs` is the base64 of the float64
        little-endian probabilities of the support and `tokens` the base64 of its int32
        little-endian token ids, ascending; a distribution whose support is the whole vocabulary
        has no `tokens` (its `probs` are all V, in token order). Base64 keeps the bytes of a float
        at 10.7 characters against ~22 for its decimal form."""
        entries = []
        for prefix in sorted(self.dists, key=lambda p: (len(p), p)):
            probs = self.dists[prefix]
            support = np.flatnonzero(probs > 0.0)
            entry = {"prefix": list(prefix), "probs": _encode(probs[support], PROBS_DTYPE)}
            if support.size < self.vocab_size:
                entry["tokens"] = _encode(support, TOKENS_DTYPE)
            entries.append(entry)
        return {"vocab_size": self.vocab_size, "prompt_token_ids": list(self.prompt_token_ids), "dists": entries}

    @classmethod
    def from_dict(cls, data: Mapping) -> Reference:
        """The inverse of `to_dict`; also reads format 2, whose `tokens` and `probs` are JSON
        lists (always both). A malformed entry raises ValueError naming the prefix."""
        vocab = int(data["vocab_size"])
        dists = {}
        for entry in data["dists"]:
            prefix = tuple(int(t) for t in entry["prefix"])
            dists[prefix] = _dense(entry, vocab, prefix)
        return cls(vocab, tuple(data["prompt_token_ids"]), dists)


def _encode(values: np.ndarray, dtype: np.dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype=dtype).tobytes()).decode("ascii")


def _decode(text: str, dtype: np.dtype, field: str, prefix: Prefix) -> np.ndarray:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as err:
        raise ValueError(f"dists prefix {list(prefix)}: {field} is not base64 ({err})") from err
    if len(raw) % dtype.itemsize:
        raise ValueError(
            f"dists prefix {list(prefix)}: {field} holds {len(raw)} bytes, not a whole "
            f"number of {dtype.itemsize}-byte values"
        )
    return np.frombuffer(raw, dtype=dtype)


def _dense(entry: Mapping, vocab: int, prefix: Prefix) -> np.ndarray:
    """f64[V] of one `dists` entry, in either encoding (`Reference.from_dict`)."""
    values, tokens = entry["probs"], entry.get("tokens")
    if isinstance(values, str):
        values = _decode(values, PROBS_DTYPE, "probs", prefix).astype(np.float64)
        tokens = (
            np.arange(vocab) if tokens is None else _decode(tokens, TOKENS_DTYPE, "tokens", prefix).astype(np.int64)
        )
    else:
        values = np.asarray(values, dtype=np.float64)
        tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.shape != values.shape or values.ndim != 1:
        raise ValueError(f"dists prefix {list(prefix)}: {values.size} probs for {tokens.size} tokens")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"dists prefix {list(prefix)}: a token outside [0, {vocab})")
    probs = np.zeros(vocab, dtype=np.float64)
    probs[tokens] = values
    return probs


def needed_prefixes(tokens: np.ndarray, vocab_size: int | None = None) -> list[Prefix]:
    """Every prefix (t_1..t_{k-1}) that occurs in samples tokens[N, n], for k = 1..n, among the rows
    whose tokens all lie in [0, vocab_size) (>= 0 when vocab_size is None): a row holding an
    out-of-range token FAILs its run and is never tested, so its prefixes are not replayed."""
    tokens = np.asarray(tokens, dtype=np.int64)
    valid = np.all(tokens >= 0, axis=1) & (np.all(tokens < vocab_size, axis=1) if vocab_size else True)
    tokens = tokens[valid]
    base = int(tokens.max()) + 1 if tokens.size else 1
    prefixes: set[Prefix] = {()}
    for k in range(1, tokens.shape[1]):
        prefixes.update(_distinct_rows(tokens[:, :k], base))
    return sorted(prefixes, key=lambda p: (len(p), p))


def _distinct_rows(rows: np.ndarray, base: int) -> list[Prefix]:
    """The distinct rows of int64[N, k] whose entries lie in [0, base), as tuples. Each row is
    read as one k-digit number in `base` where that fits an int64 (a 1-D unique: ~10x faster
    than `np.unique(axis=0)` at 1.3 M rows), else by `np.unique(axis=0)`."""
    k = rows.shape[1]
    if base**k >= 2**62:
        return list(map(tuple, np.unique(rows, axis=0).tolist()))
    weights = base ** np.arange(k - 1, -1, -1, dtype=np.int64)  # most significant first
    keys = np.unique(rows @ weights)
    return list(map(tuple, ((keys[:, None] // weights) % base).tolist()))


def build_reference(
    target_logits: Callable[[list[int]], np.ndarray],
    prompt_ids: Sequence[int],
    prefixes: Iterable[Prefix],
    sampling: SamplingSpec,
    vocab_size: int,
    semantics: FilterSemantics = DEFAULT_SEMANTICS,
) -> Reference:
    """Replay the target model serially on prompt + prefix and apply `transform` (under `semantics`) in float64.
    Prefixes holding a token outside [0, vocab_size) are skipped (no model can replay them)."""
    dists = {}
    for prefix in prefixes:
        if any(not 0 <= int(t) < vocab_size for t in prefix):
            continue
        logits = np.asarray(target_logits(list(prompt_ids) + list(prefix)), dtype=np.float64)
        if logits.shape != (vocab_size,):
            raise ValueError(f"target logits: expected shape ({vocab_size},), got {logits.shape}")
        dists[tuple(prefix)] = transform(logits, sampling, semantics)
    return Reference(vocab_size, tuple(prompt_ids), dists)
