"""Plots of a bundle as PNG bytes: observed vs expected per stratum, p-values across strata,
acceptance by position. Rendering is deterministic (no timestamps in the PNG metadata)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from specval.distribution.reference import Reference  # noqa: E402
from specval.distribution.strata import strata  # noqa: E402

MAX_STRATA_PLOTTED = 4
MAX_TOKENS_PLOTTED = 12


def warm_up() -> None:
    """Draw and discard one small figure with text: loads the fonts and the PNG writer, so the
    first real figure of a fresh process does not pay for them (its bytes do not depend on it)."""
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.set_title("0", fontsize=6)
    fig.tight_layout()
    _png(fig)


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def tokens_by_group(samples: pd.DataFrame, groups: set[str], positions: int) -> dict[str, np.ndarray]:
    """int64[n, positions] per group of `groups`: the tokens of its rows of `samples`, in row order
    (empty for a group without rows), from one pass over the group column."""
    codes, names = pd.factorize(samples["group"])
    tokens = samples[[f"t{k}" for k in range(1, positions + 1)]].to_numpy(dtype=np.int64)  # [N, positions]
    index = {name: code for code, name in enumerate(names)}
    return {group: tokens[codes == index.get(group, -2)] for group in groups}  # -2: no row (factorize's NA is -1)


def group_tokens(samples: pd.DataFrame, group: str, positions: int) -> np.ndarray:
    """`tokens_by_group` of one group."""
    return tokens_by_group(samples, {group}, positions)[group]


def observed_vs_expected(
    name: str, test: dict, samples: pd.DataFrame, reference: Reference, positions: int
) -> bytes | None:
    """Bars of observed and expected counts of the most likely tokens in the largest strata."""
    return observed_figure(name, group_tokens(samples, test["group"], positions), test["position"], reference)


def observed_figure(name: str, tokens: np.ndarray, position: int, reference: Reference) -> bytes | None:
    """`observed_vs_expected` of one group's tokens int64[n, positions] (`group_tokens`)."""
    parts = sorted(strata(tokens, position), key=lambda s: -len(s[1]))[:MAX_STRATA_PLOTTED]
    if not parts:
        return None
    fig, axes = plt.subplots(1, len(parts), figsize=(4 * len(parts), 3), squeeze=False)
    for ax, (prefix, target) in zip(axes[0], parts):
        probs = reference.probs(prefix)
        top = np.argsort(-probs, kind="stable")[:MAX_TOKENS_PLOTTED]
        counts = np.bincount(target, minlength=reference.vocab_size)[top]
        x = np.arange(len(top))
        ax.bar(x - 0.2, counts, 0.4, label="observed")
        ax.bar(x + 0.2, len(target) * probs[top], 0.4, label="expected")
        ax.set_xticks(x, [str(t) for t in top], fontsize=6, rotation=90)
        ax.set_title(f"prefix {list(prefix)} (n={len(target)})", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(name, fontsize=9)
    fig.tight_layout()
    return _png(fig)


def pvalues_across_strata(tests: dict) -> bytes | None:
    """Per-stratum p-values of every stratified criterion, with the alpha line."""
    stratified = {n: t for n, t in tests.items() if t.get("strata")}
    if not stratified:
        return None
    fig, ax = plt.subplots(figsize=(7, 3))
    for i, (_, test) in enumerate(sorted(stratified.items())):
        values = [s["p_value"] for s in test["strata"]]
        ax.scatter(np.full(len(values), i), values, s=10)
    alpha = next(t["alpha"] for t in stratified.values() if t["alpha"] is not None)
    ax.axhline(alpha, color="red", lw=0.8, label=f"alpha = {alpha}")
    ax.set_xticks(range(len(stratified)), sorted(stratified), fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("p-value per stratum")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def acceptance_by_position(groups: dict) -> bytes | None:
    """Stacked share of token sources (plain / accepted / correction / bonus) per group and position."""
    bars = [(g, pos, src) for g, facts in sorted(groups.items()) for pos, src in facts["sources"].items()]
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * len(bars)), 3))
    bottoms = np.zeros(len(bars))
    for source in ("plain", "accepted", "correction", "bonus"):
        shares = np.array([src.get(source, 0) / max(1, sum(src.values())) for _, _, src in bars])
        ax.bar(range(len(bars)), shares, bottom=bottoms, label=source)
        bottoms += shares
    ax.set_xticks(range(len(bars)), [f"{g}:{p}" for g, p, _ in bars], fontsize=6, rotation=45, ha="right")
    ax.set_ylabel("share of tokens")
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    return _png(fig)
