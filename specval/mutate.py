"""Mutate: run one protocol against every planted bug of the engine and tabulate which are killed.

For each mutant of `engine.mutants` the protocol is re-written with `sut.options.mutant` set and
run as an ordinary run (its own bundle, fresh seeds from the mutate root's ledger). A mutant is
*killed* when the run FAILs, when the seed ledger refuses it before sampling (exit 2: the seed
collision), or when the stop-point check fails. The kill table records, per mutant: its exact TV
from the target at t1 (per speculative group, from the model's p and q at the prompt; 0 when the
bug cannot act on t1), the MDE of the t1 criteria, killed yes/no, by which criteria, and their
p-values. It is written as `kill_table.json` and `kill_table.md` into the mutate root, which also
holds every mutant's bundle.

Stop-point check: the accept rule at the single point u_accept = 0 on a draft token with p = 0
and q > 0 must reject it (quadrature and Monte Carlo integrate over u and cannot see one point).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from specval import bundle as bundles
from specval import runner, seeds
from specval.protocol import Protocol, load_protocol, resolve
from specval.reference import transform
from specval.sut import open_sut

KILL_TABLE_JSON, KILL_TABLE_MD = "kill_table.json", "kill_table.md"
SEED_COLLISION = "seed_collision"
STOP_POINT_CHECK = "stop_point_check"
LEDGER_CHECK = "seed_ledger"


# ---------------------------------------------------------------- exact t1 laws


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _spec_law(p: np.ndarray, s: np.ndarray, a: np.ndarray, accept: np.ndarray | None = None,
              residual: np.ndarray | None = None, unnormalised: bool = False) -> np.ndarray:
    """Law of the first token of one step: x ~ s, accepted w.p. accept[x] (default min(1, p / a)),
    else drawn from `residual` (default max(p - a, 0)), renormalised unless `unnormalised`."""
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(a > 0, np.minimum(1.0, p / a), 0.0) if accept is None else accept
    residual = np.maximum(p - a, 0.0) if residual is None else residual
    reject = 1.0 - float((s * accept).sum())
    if unnormalised:
        last = np.flatnonzero(residual > 0)[-1]
        drawn = residual.copy()
        drawn[last] += 1.0 - residual.sum()
    else:
        drawn = residual / residual.sum() if residual.sum() > 0 else np.zeros_like(p)
    return s * accept + reject * drawn


def _ties_dropped(logits: np.ndarray, temperature: float, k: int) -> np.ndarray:
    x = logits / temperature
    if k <= 0 or k >= x.size:
        return _softmax(x)
    keep = np.zeros(x.size, dtype=bool)
    keep[np.argsort(-x, kind="stable")[:k]] = True
    return _softmax(np.where(keep, x, -np.inf))


def _boundary_excluded(p: np.ndarray, top_p: float) -> np.ndarray:
    if top_p >= 1.0:
        return p
    order = np.argsort(-p, kind="stable")
    keep_sorted = np.cumsum(p[order]) < top_p
    keep_sorted[0] = True
    kept = np.zeros_like(p)
    kept[order[keep_sorted]] = p[order[keep_sorted]]
    return kept / kept.sum()


def t1_law(name: str, target_logits: np.ndarray, draft_logits: np.ndarray, protocol: Protocol) -> np.ndarray | None:
    """Exact law of t1 of a speculative group under mutant `name` (None: not computed)."""
    sampling, t = protocol.sampling, protocol.sampling.temperature
    p, q = transform(target_logits, sampling), transform(draft_logits, sampling)
    p_raw, q_raw = _softmax(target_logits / t), _softmax(draft_logits / t)
    hot = np.eye(q.size)[int(np.argmax(q))]
    with np.errstate(divide="ignore", invalid="ignore"):
        inverted = np.where(p > 0, np.minimum(1.0, q / p), 1.0)
    laws = {
        "residual_from_p": lambda: _spec_law(p, q, q, residual=p),
        "residual_unnormalised": lambda: _spec_law(p, q, q, unnormalised=True),
        "residual_abs": lambda: _spec_law(p, q, q, residual=np.abs(p - q)),
        "ratio_inverted": lambda: _spec_law(p, q, q, accept=inverted),
        "draft_filtered_ratio_raw": lambda: _spec_law(p, q, q_raw),
        "target_unfiltered": lambda: _spec_law(p_raw, q, q),
        "argmax_draft": lambda: _spec_law(p, hot, q),
        "temperature_twice": lambda: transform(target_logits / t, sampling),
        "top_k_ties_dropped": lambda: _boundary_excluded(_ties_dropped(target_logits, t, sampling.top_k), sampling.top_p)
        if sampling.top_p >= 1.0 else None,
        "top_p_boundary_excluded": lambda: _boundary_excluded(p, sampling.top_p),
    }
    same_at_t1 = ("accept_le", "uniform_reused", "bonus_wrong_position", "bonus_from_q", "accept_by_division")
    if name in same_at_t1:
        return _spec_law(p, q, q)
    return laws[name]() if name in laws else None


def t1_tv(name: str, sut, protocol: Protocol) -> dict[str, float | None]:
    """Exact TV at t1 between the mutant's law and p, per speculative group."""
    prompt = sut.encode(protocol.prompt)
    target = np.asarray(sut.target_logits(prompt), dtype=np.float64)
    p = transform(target, protocol.sampling)
    out = {}
    for group in (g for g in protocol.groups if g.is_speculative):
        law = t1_law(name, target, np.asarray(sut.draft_logits(group, prompt), dtype=np.float64), protocol)
        out[group.name] = None if law is None else float(0.5 * np.abs(law - p).sum())
    return out


# ---------------------------------------------------------------- checks


def stop_point_check(sut, vocab_size: int) -> bool:
    """True iff the accept rule rejects a draft token with p = 0 at u_accept = 0 (the correct rule)."""
    p = np.full((1, vocab_size), 1.0 / (vocab_size - 1))
    p[0, 0] = 0.0
    q = np.full((1, vocab_size), 1.0 / vocab_size)
    first = sut.accept_single(np.array([0]), q.astype(sut.prob_dtype), p.astype(sut.prob_dtype),
                              np.array([[0.0, 0.0, 0.5]]))
    return int(first[0]) != 0


def seed_collision_refused(protocol: Protocol, output: Path) -> bool:
    """True iff the ledger refuses a run whose groups all share one seed range (before sampling)."""
    ranges = [seeds.SeedRange(protocol.name, "collision", g.name, protocol.seed_base,
                              protocol.seed_base + max(protocol.samples_per_group, 1)) for g in protocol.groups]
    try:
        seeds.check_disjoint(seeds.read_ledger(output), ranges)
    except seeds.SeedOverlapError:
        return True
    return False


# ---------------------------------------------------------------- one mutant


def _mutant_file(protocol_file: Path, root: Path, name: str, samples: int | None) -> Path:
    raw = yaml.safe_load(Path(protocol_file).read_text())
    raw.setdefault("sut", {}).setdefault("options", {})["mutant"] = name
    if samples is not None:
        raw["samples_per_group"] = samples
        raw.pop("profiles", None)
    path = root / "protocols" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _gating_failures(summary: dict) -> dict[str, float | None]:
    """Gating criteria that fail the RUN, with their stage-1 p-values: after two-stage
    confirmation when the protocol has it (a stage-1 FAIL that stage 2 does not confirm kills
    nothing), else the stage-1 control/primary FAILs."""
    confirmed = summary.get("confirmation", {}).get("failing")
    if confirmed is None:
        confirmed = [n for n, t in summary["tests"].items()
                     if t["role"] in ("control", "primary") and t["verdict"] == "FAIL"]
    return {n: summary["tests"][n].get("p_value") for n in sorted(confirmed)}


def _t1_mde(summary: dict) -> float | None:
    mdes = [t["mde_tv"] for n, t in summary["tests"].items() if n.startswith("t1_gof.") and t["mde_tv"] is not None]
    return max(mdes) if mdes else None


def run_mutant(mutant, protocol_file: Path, profile: str | None, root: Path, samples: int | None) -> dict[str, Any]:
    """Run one mutant; returns its kill-table row."""
    row = {"mutant": mutant.name, "equivalent": mutant.equivalent, "visible_at": mutant.visible_at,
           "breaks": mutant.breaks}
    file = _mutant_file(protocol_file, root, mutant.name, samples)
    protocol = resolve(load_protocol(file), None if samples is not None else profile)
    if mutant.name == SEED_COLLISION:
        refused = seed_collision_refused(protocol, root)
        return row | {"tv_t1": None, "mde_t1": None, "killed": refused, "verdict": "REFUSED" if refused else "RAN",
                      "killed_by": [LEDGER_CHECK] if refused else [], "p_values": {}, "bundle": None}
    sut = open_sut(protocol.sut, protocol.num_speculative_tokens)
    try:
        tv = t1_tv(mutant.name, sut, protocol)
        stop_ok = stop_point_check(sut, sut.vocab_size)
    finally:
        sut.close()
    path, summary = runner.run(file, None if samples is not None else profile, root, progress=False,
                               exploratory=True)  # a mutant protocol is a modified copy, never frozen
    failed = _gating_failures(summary)
    killed_by = sorted(failed) + ([] if stop_ok else [STOP_POINT_CHECK])
    known = [v for v in tv.values() if v is not None]
    return row | {"tv_t1": max(known) if known else None, "tv_t1_by_group": tv, "mde_t1": _t1_mde(summary),
                  "killed": bool(killed_by), "verdict": summary["verdict"], "killed_by": killed_by,
                  "p_values": failed, "bundle": path.name}


# ---------------------------------------------------------------- the table


def expected_outcome(row: dict) -> bool:
    """The target: equivalent mutants survive; a mutant is killed when its t1 TV exceeds the t1 MDE,
    or it acts where only the ledger or the stop-point check can see it. Otherwise no promise."""
    if row["equivalent"]:
        return not row["killed"]
    if row["tv_t1"] is not None and row["mde_t1"] is not None and row["tv_t1"] > row["mde_t1"]:
        return row["killed"]
    return True


def render(table: list[dict], command: str) -> str:
    lines = [f"# Kill table\n\nCommand: `{command}`\n",
             "| mutant | equivalent | exact TV at t1 (max over groups) | t1 MDE | killed | by | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in table:
        tv = "n/a" if row["tv_t1"] is None else f"{row['tv_t1']:.4g}"
        mde = "n/a" if row["mde_t1"] is None else f"{row['mde_t1']:.3g}"
        by = ", ".join(f"{n} (p={p:.2g})" if isinstance(p, float) else n
                       for n, p in ((n, row["p_values"].get(n)) for n in row["killed_by"])) or "-"
        lines.append(f"| {row['mutant']} | {'yes' if row['equivalent'] else 'no'} | {tv} | {mde} | "
                     f"{'yes' if row['killed'] else 'no'} | {by} | {row['verdict']} |")
    return "\n".join(lines) + "\n"


def mutate(protocol_file: Path, profile: str | None, output: Path, names: tuple[str, ...] = (),
           samples: int | None = None, command: str = "") -> tuple[Path, list[dict]]:
    """Run the protocol against the named mutants (all when `names` is empty); write the table."""
    from engine import mutants

    chosen = [mutants.get(n) for n in names] if names else list(mutants.MUTANTS)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    root = Path(output) / f"mutate-{load_protocol(protocol_file).name}-{stamp}"
    root.mkdir(parents=True)
    table = [run_mutant(m, Path(protocol_file), profile, root, samples) for m in chosen]
    for row in table:
        row["as_expected"] = expected_outcome(row)
    bundles.write_json(root / KILL_TABLE_JSON, {"protocol": str(protocol_file), "profile": profile,
                                                "samples_per_group": samples, "command": command, "rows": table})
    (root / KILL_TABLE_MD).write_text(render(table, command))
    return root, table
