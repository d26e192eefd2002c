"""Mutate: run a protocol suite against every planted bug of its adapter and tabulate which are killed.

The mutant list is the adapter's (`Capabilities.mutants` of the suite's one adapter: the engine
adapter lists `engine.mutants`), followed by the harness's own mutants (`HARNESS_MUTANTS`: the
seed collision, which no adapter plants). For each mutant, the suite's protocols (files, or every
*.yaml of a directory, in sorted order) are re-written with `sut.options.mutant` set and run as
ordinary runs, one after the other until one kills the mutant: its run FAILs (a gating
criterion, after two-stage confirmation where the protocol has it; the quadrature family includes
the stop point), or the seed ledger refuses it before sampling (the seed collision). Equivalent
mutants and survivors run every protocol. Each mutant runs in its own folder `<root>/<mutant>/`
with its own seed ledger, so a mutant's row is a function of the mutant, the suite and the sizes
alone: the same whichever other mutants are chosen, in whatever order or number of worker
processes (`workers`) they run.

The kill table records, per mutant: the killing protocol and criteria with their p-values, the
MDE of the killing criterion next to the mutant's exact TV at that position (t1 from the model's
p and q at the prompt, closed form per engine mutant; t2 for the bonus mutants of a K = 1
protocol; None, shown n/a, for mutants of other adapters and where no closed form is
implemented), and the smallest t1 MDE of the protocols run. It is written as `kill_table.json`
and `kill_table.md` into the mutate root, which also holds every bundle.
"""

from __future__ import annotations

import datetime as dt
import re
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from specval import bundle as bundles
from specval import seeds
from specval.distribution.reference import transform
from specval.kinds import DISTRIBUTION_KIND, read_protocol_file
from specval.protocol import Protocol, resolve
from specval.semantics import DEFAULT_SEMANTICS, FilterSemantics
from specval.sut import DEFAULT_ADAPTER, PlantedMutant, capabilities_of, load_adapter, open_sut

KILL_TABLE_JSON, KILL_TABLE_MD = "kill_table.json", "kill_table.md"
SEED_COLLISION = "seed_collision"
LEDGER_CHECK = "seed_ledger"
EVERY_RUNNER = ("temperature_twice", "top_k_ties_dropped", "top_p_boundary_excluded")  # change p of every runner
# change p of every runner in some engine settings only (a group's options): no one exact law at t1
SETTING_DEPENDENT = ("mixed_step_unfiltered",)
BONUS_MUTANTS = ("bonus_wrong_position", "bonus_from_q")
HARNESS_MUTANTS = (
    PlantedMutant(
        SEED_COLLISION,
        "every group of a run gets the same seed range",
        visible_at="the seed ledger (refused before sampling)",
    ),
)


# ---------------------------------------------------------------- exact t1 laws


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _spec_law(
    p: np.ndarray,
    s: np.ndarray,
    a: np.ndarray,
    accept: np.ndarray | None = None,
    residual: np.ndarray | None = None,
    unnormalised: bool = False,
) -> np.ndarray:
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


def t1_law(
    name: str,
    target_logits: np.ndarray,
    draft_logits: np.ndarray,
    protocol: Protocol,
    semantics: FilterSemantics = DEFAULT_SEMANTICS,
) -> np.ndarray | None:
    """Exact law of t1 of a speculative group under mutant `name` (None: not computed); p and q
    follow the adapter's filter `semantics`."""
    sampling, t = protocol.sampling, protocol.sampling.temperature
    p, q = transform(target_logits, sampling, semantics), transform(draft_logits, sampling, semantics)
    p_raw, q_raw = _softmax(target_logits / t), _softmax(draft_logits / t)
    hot = np.eye(q.size)[int(np.argmax(q))]
    with np.errstate(divide="ignore", invalid="ignore"):
        inverted = np.where(p > 0, np.minimum(1.0, q / p), 1.0)
        kept_if_q_zero = np.where(q > 0, np.minimum(1.0, p / q), (p > 0).astype(np.float64))  # u q < p at q = 0
    laws = {
        "residual_from_p": lambda: _spec_law(p, q, q, residual=p),
        "residual_unnormalised": lambda: _spec_law(p, q, q, unnormalised=True),
        "residual_abs": lambda: _spec_law(p, q, q, residual=np.abs(p - q)),
        "ratio_inverted": lambda: _spec_law(p, q, q, accept=inverted),
        "draft_filtered_ratio_raw": lambda: _spec_law(p, q, q_raw),
        "draft_raw_ratio_filtered": lambda: _spec_law(p, _softmax(draft_logits), q, accept=kept_if_q_zero),
        "target_unfiltered": lambda: _spec_law(p_raw, q, q),
        "argmax_draft": lambda: _spec_law(p, hot, q),
        "temperature_twice": lambda: transform(target_logits / t, sampling, semantics),
        "top_k_ties_dropped": lambda: (
            _ties_dropped(target_logits, t, sampling.top_k) if sampling.top_p >= 1.0 else None
        ),
        "top_p_boundary_excluded": lambda: _boundary_excluded(p, sampling.top_p),
        "float32_cdf": lambda: _spec_law(p, _float32_cdf_law(q), q),
    }
    same_at_t1 = ("accept_le", "uniform_reused", "bonus_wrong_position", "bonus_from_q", "accept_by_division")
    if name in same_at_t1:
        return _spec_law(p, q, q)
    return laws[name]() if name in laws else None


def _float32_cdf_law(p: np.ndarray) -> np.ndarray:
    """Exact law of an inverse-CDF draw whose cumulative sum and total are float32 (mutant float32_cdf)."""
    probs = p.astype(np.float32)
    cdf = np.cumsum(probs, dtype=np.float32).astype(np.float64)
    lower = np.concatenate([[0.0], cdf[:-1]])
    law = np.where(probs > 0, np.maximum(cdf - lower, 0.0), 0.0) / cdf[-1]
    return law / law.sum()


def plain_law(
    name: str, target_logits: np.ndarray, protocol: Protocol, semantics: FilterSemantics = DEFAULT_SEMANTICS
) -> np.ndarray | None:
    """Exact law of t1 of a nospec group under mutant `name` (None: not computed)."""
    p = transform(target_logits, protocol.sampling, semantics)
    if name in SETTING_DEPENDENT:
        return None
    if name == "float32_cdf":
        return _float32_cdf_law(p)
    if name in EVERY_RUNNER:
        return t1_law(name, target_logits, target_logits, protocol, semantics)
    return p


def _filtered(logits, protocol: Protocol, semantics: FilterSemantics) -> np.ndarray:
    """The protocol's sampling law (float64) of a model's logits, under the adapter's semantics."""
    return transform(np.asarray(logits, dtype=np.float64), protocol.sampling, semantics)


def t1_tv(name: str, sut, protocol: Protocol) -> dict[str, float | None]:
    """Exact TV at t1 between the mutant's law and p, per group."""
    prompt, semantics = sut.encode(protocol.prompt), capabilities_of(sut).semantics
    target = np.asarray(sut.target_logits(prompt), dtype=np.float64)
    p = transform(target, protocol.sampling, semantics)
    out = {}
    for group in protocol.groups:
        if group.is_speculative:
            draft = np.asarray(sut.draft_logits(group, prompt), dtype=np.float64)
            law = t1_law(name, target, draft, protocol, semantics)
        else:
            law = plain_law(name, target, protocol, semantics)
        out[group.name] = None if law is None else float(0.5 * np.abs(law - p).sum())
    return out


def bonus_tv(name: str, sut, protocol: Protocol) -> dict[str, float | None]:
    """Exact TV of (t1, t2) from the target's law under a bonus mutant of a K = 1 protocol, per
    speculative group: sum over t1 of P(t1 is an accepted draft) * TV(bonus row, p(. | t1)), the
    bonus row being p_1 (bonus_wrong_position) or q_1 (bonus_from_q) at the prompt."""
    if name not in BONUS_MUTANTS or protocol.num_speculative_tokens != 1 or protocol.positions < 2:
        return {}
    prompt, semantics = sut.encode(protocol.prompt), capabilities_of(sut).semantics
    target = np.asarray(sut.target_logits(prompt), dtype=np.float64)
    p = transform(target, protocol.sampling, semantics)
    after = {
        int(t): _filtered(sut.target_logits(prompt + [int(t)]), protocol, semantics) for t in np.flatnonzero(p > 0)
    }
    out = {}
    for group in (g for g in protocol.groups if g.is_speculative):
        q = _filtered(sut.draft_logits(group, prompt), protocol, semantics)
        bonus = p if name == "bonus_wrong_position" else q
        out[group.name] = float(sum(min(p[t], q[t]) * 0.5 * np.abs(bonus - row).sum() for t, row in after.items()))
    return out


def _first_round_drafts(protocol: Protocol, group) -> int:
    """Drafts of a request's first round: K, capped so that the round's bonus fits the request."""
    return min(protocol.num_speculative_tokens, protocol.max_tokens(group) - 1)


def _reused_row(p2: np.ndarray, q2: np.ndarray, r1: float) -> np.ndarray:
    """Law of the second position of a round whose first draft was accepted with ratio r1 < 1 when
    the accept uniform is reused: u | accepted ~ U(0, r1), so the second draft x is accepted w.p.
    min(1, r2(x) / r1), else the correction is drawn from max(p2 - q2, 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q2 > 0, p2 / q2, 0.0)
    return _spec_law(p2, q2, q2, accept=np.minimum(1.0, ratio / r1))


def reused_uniform_tv(name: str, sut, protocol: Protocol) -> dict[str, float | None]:
    """Exact TV of t2 given t1 (sum over t1 of p(t1) TV(law of t2 | t1, p(. | t1))) under
    uniform_reused, per speculative group whose first round drafts t2: only a t1 accepted with
    ratio r1 = p(t1) / q(t1) < 1 changes t2, with weight P(t1 is such an accepted draft) = q r1."""
    if name != "uniform_reused" or protocol.positions < 2:
        return {}
    prompt, semantics = sut.encode(protocol.prompt), capabilities_of(sut).semantics
    p1, out = _filtered(sut.target_logits(prompt), protocol, semantics), {}
    for group in (g for g in protocol.groups if g.is_speculative and _first_round_drafts(protocol, g) >= 2):
        q1, total = _filtered(sut.draft_logits(group, prompt), protocol, semantics), 0.0
        for x in np.flatnonzero((q1 > 0) & (p1 > 0) & (p1 < q1)):
            r1, after = p1[x] / q1[x], prompt + [int(x)]
            p2 = _filtered(sut.target_logits(after), protocol, semantics)
            q2 = _filtered(sut.draft_logits(group, after), protocol, semantics)
            total += q1[x] * r1 * 0.5 * np.abs(_reused_row(p2, q2, r1) - p2).sum()
        out[group.name] = float(total)
    return out


# ---------------------------------------------------------------- checks


def _group_size(protocol) -> int:
    """Requests per group of a protocol of any kind (samples, sequences)."""
    return int(getattr(protocol, "samples_per_group", None) or getattr(protocol, "sequences_per_group", 1))


def seed_collision_refused(protocol: Protocol, output: Path) -> bool:
    """True iff the ledger refuses a run whose groups all share one seed range (before sampling)."""
    ranges = [
        seeds.SeedRange(
            protocol.name, "collision", g.name, protocol.seed_base, protocol.seed_base + max(_group_size(protocol), 1)
        )
        for g in protocol.groups
    ]
    try:
        seeds.check_disjoint(seeds.read_ledger(output), ranges)
    except seeds.SeedOverlapError:
        return True
    return False


# ---------------------------------------------------------------- one mutant, one protocol


def _mutant_file(protocol_file: Path, root: Path, name: str, samples: int | None) -> Path:
    """A copy of the protocol with `sut.options.mutant` set (and, for a distribution protocol,
    `samples_per_group` replaced by `samples` when given)."""
    raw = yaml.safe_load(Path(protocol_file).read_text())
    raw.setdefault("sut", {}).setdefault("options", {})["mutant"] = name
    if samples is not None and raw.get("kind", DISTRIBUTION_KIND) == DISTRIBUTION_KIND:
        raw["samples_per_group"] = samples
        raw.pop("profiles", None)
    path = root / "protocols" / f"{raw['name']}-{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _gating_failures(summary: dict) -> dict[str, float | None]:
    """Gating criteria that fail the RUN, with their stage-1 p-values: after two-stage
    confirmation when the protocol has it (a stage-1 FAIL that stage 2 does not confirm kills
    nothing), else the stage-1 control/primary FAILs."""
    confirmed = summary.get("confirmation", {}).get("failing")
    if confirmed is None:
        confirmed = [
            n for n, t in summary["tests"].items() if t["role"] in ("control", "primary") and t["verdict"] == "FAIL"
        ]
    return {n: summary["tests"][n].get("p_value") for n in sorted(confirmed)}


def _min_mde(summary: dict, prefix: str) -> float | None:
    mdes = [t["mde_tv"] for n, t in summary["tests"].items() if n.startswith(prefix) and t["mde_tv"] is not None]
    return min(mdes) if mdes else None


def _exact_tv(name: str, sut, protocol: Protocol) -> dict[str, float | None]:
    """{"t1": max over groups, "t2": max over groups (bonus mutants at K = 1, uniform_reused)};
    None: not computed."""
    if protocol.sut.adapter != DEFAULT_ADAPTER:  # the closed forms describe the engine's mutants only
        return {"t1": None, "t2": None}
    known = [v for v in t1_tv(name, sut, protocol).values() if v is not None]
    second = [
        v for v in (bonus_tv(name, sut, protocol) | reused_uniform_tv(name, sut, protocol)).values() if v is not None
    ]
    return {"t1": max(known) if known else None, "t2": max(second) if second else None}


def _killing_position(criteria: list[str]) -> str:
    """'t1', 't2', ... of the earliest killing positional criterion; 't1' for quadrature kills; the
    criterion's test (e.g. 'serial') for a sequence protocol's kill."""
    positions = sorted(n.split("_", 1)[0] for n in criteria if re.match(r"t\d+_", n))
    if positions:
        return positions[0]
    others = [n.split(".")[0] for n in criteria if not n.startswith("quadrature")]
    return others[0] if others else "t1"


def _cost(path: Path) -> dict[str, Any]:
    """What a run cost until its verdict: samples drawn and process seconds (its manifest)."""
    manifest = bundles.read_json(path / bundles.MANIFEST_FILE)
    return {"samples": manifest.get("samples_drawn"), "seconds": manifest.get("wall_s")}


def run_protocol(mutant, protocol_file: Path, profile: str | None, root: Path, samples: int | None) -> dict[str, Any]:
    """Run one mutant on one protocol of the suite (of any kind); returns its cell of the kill table."""
    file = _mutant_file(protocol_file, root, mutant.name, samples)
    loaded = read_protocol_file(file)
    distribution = loaded.kind.name == DISTRIBUTION_KIND
    profile = None if samples is not None and distribution else profile
    protocol = resolve(loaded.load(), profile)
    cell = {"protocol": protocol.name, "file": str(protocol_file)}
    if mutant.name == SEED_COLLISION:
        refused = seed_collision_refused(protocol, root)
        return cell | {
            "killed": refused,
            "verdict": "REFUSED" if refused else "RAN",
            "killed_by": [LEDGER_CHECK] if refused else [],
            "p_values": {},
            "bundle": None,
            "tv": {"t1": None, "t2": None},
            "mde": None,
            "mde_t1": None,
        }
    tv = {"t1": None, "t2": None}
    if protocol.sut.adapter == DEFAULT_ADAPTER and distribution:
        sut = open_sut(protocol.sut, protocol.num_speculative_tokens)
        try:
            tv = _exact_tv(mutant.name, sut, protocol)
        finally:
            sut.close()
    path, summary = loaded.kind.runner()(
        file, profile, root, progress=False, exploratory=True
    )  # a mutant protocol is a modified copy, never frozen
    cell |= _cost(path)
    failed = _gating_failures(summary)
    killing = [n for n in failed if summary["tests"][n]["mde_tv"] is not None]
    # a run that stopped at an early sequential look may FAIL a positional criterion whose table is
    # too small for an MDE (out-of-support samples): its position still names where the bug showed
    position = _killing_position([n for n in failed if re.match(r"t\d+_", n)] or killing)
    mdes = [summary["tests"][n]["mde_tv"] for n in killing if n.startswith(position)]
    return cell | {
        "killed": bool(failed),
        "verdict": summary["verdict"],
        "killed_by": sorted(failed),
        "p_values": failed,
        "bundle": str(path.relative_to(root.parent)),
        "tv": tv,
        "kill_position": position,
        "mde": max(mdes) if mdes else None,
        "mde_t1": _min_mde(summary, "t1_gof."),
    }


def run_mutant(
    mutant, protocol_files: list[Path], profile: str | None, root: Path, samples: int | None
) -> dict[str, Any]:
    """Run one mutant through the suite, stopping at the first kill unless it is equivalent."""
    cells = []
    for protocol_file in protocol_files:
        cells.append(run_protocol(mutant, protocol_file, profile, root, samples))
        if cells[-1]["killed"] and not mutant.equivalent:
            break
    killer = next((c for c in cells if c["killed"]), None)
    row = {
        "mutant": mutant.name,
        "equivalent": mutant.equivalent,
        "visible_at": mutant.visible_at,
        "breaks": mutant.breaks,
        "killed": killer is not None,
        "runs": cells,
        "killed_in": killer["protocol"] if killer else None,
        "killed_by": killer["killed_by"] if killer else [],
        "p_values": killer["p_values"] if killer else {},
        "samples_to_kill": killer.get("samples") if killer else None,
        "seconds_to_kill": killer.get("seconds") if killer else None,
    }
    known_t1 = [c["tv"]["t1"] for c in cells if c["tv"]["t1"] is not None]
    row["tv_t1"] = max(known_t1) if known_t1 else None
    mde_t1 = [c["mde_t1"] for c in cells if c["mde_t1"] is not None]
    row["min_mde_t1"] = min(mde_t1) if mde_t1 else None
    if killer is not None and killer.get("kill_position"):
        row["tv_at_kill"] = killer["tv"].get(killer["kill_position"])
        row["mde_at_kill"], row["kill_position"] = killer["mde"], killer["kill_position"]
    return row


# ---------------------------------------------------------------- the table


def expected_outcome(row: dict) -> bool:
    """The target: equivalent mutants pass every protocol; every other mutant is killed, unless it
    can show at t1 only (`visible_at` starts with "t1" and names no other position) and its exact
    TV at t1 is known and lies below the smallest t1 MDE of the protocols it ran. A survivor that
    acts beyond t1 (uniform_reused, the bonus mutants) is never as targeted: a t1 TV says nothing
    about it."""
    if row["equivalent"]:
        return not row["killed"]
    if row["killed"]:
        return True
    at_t1_only = str(row.get("visible_at") or "").startswith("t1") and not any(
        f"t{k}" in str(row.get("visible_at")) for k in range(2, 10)
    )
    return (
        at_t1_only and row["tv_t1"] is not None and row["min_mde_t1"] is not None and row["tv_t1"] < row["min_mde_t1"]
    )


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}"


def render(table: list[dict], command: str) -> str:
    lines = [
        f"# Kill table\n\nCommand: `{command}`\n",
        "| mutant | equivalent | killed | in protocol | by | exact TV (position) | MDE of the killing criterion | "
        "smallest t1 MDE run | samples to kill | seconds to kill |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table:
        by = (
            ", ".join(
                f"{n} (p={p:.2g})" if isinstance(p, float) else n
                for n, p in ((n, row["p_values"].get(n)) for n in row["killed_by"])
            )
            or "-"
        )
        position = row.get("kill_position") or "t1"
        tv = row.get("tv_at_kill") if row["killed"] else row["tv_t1"]
        lines.append(
            f"| {row['mutant']} | {'yes' if row['equivalent'] else 'no'} | {'yes' if row['killed'] else 'no'} | "
            f"{row['killed_in'] or '-'} | {by} | {_number(tv, 4)} ({position}) | "
            f"{_number(row.get('mde_at_kill'))} | {_number(row['min_mde_t1'])} | "
            f"{_number(row.get('samples_to_kill'), 6)} | {_number(row.get('seconds_to_kill'))} |"
        )
    return "\n".join(lines) + "\n"


def suite_files(paths: tuple[Path, ...] | list[Path]) -> list[Path]:
    """The suite's protocol files: each file as given, each directory's *.yaml in sorted order."""
    files = []
    for path in map(Path, paths):
        files += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"no protocol file (*.yaml) in {', '.join(str(p) for p in paths)}")
    return files


def suite_adapter(protocols: list[Protocol], files: list[Path]) -> str:
    """The one adapter (`sut.adapter`) of the suite's protocols; ValueError naming two that differ."""
    adapters = {p.sut.adapter: f for p, f in zip(protocols, files)}
    if len(adapters) > 1:
        (first, a), (second, b) = list(adapters.items())[:2]
        raise ValueError(
            f"the suite mixes adapters: {a} uses sut.adapter {first!r}, {b} uses {second!r}; "
            "mutate runs one adapter's mutants"
        )
    return next(iter(adapters))


def adapter_mutants(adapter: str, names: tuple[str, ...] = ()) -> list[PlantedMutant]:
    """The adapter's planted bugs then HARNESS_MUTANTS (all when `names` is empty, else those named,
    in the order named); ValueError naming a name the adapter does not list, and the adapter."""
    listed = list(capabilities_of(load_adapter(adapter)).mutants) + list(HARNESS_MUTANTS)
    by_name = {m.name: m for m in listed}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(
            f"--mutant {unknown[0]!r}: adapter {adapter!r} does not list it (it lists {[m.name for m in listed]})"
        )
    return [by_name[n] for n in names] if names else listed


def mutate(
    protocol_paths: tuple[Path, ...] | list[Path],
    profile: str | None,
    output: Path,
    names: tuple[str, ...] = (),
    samples: int | None = None,
    command: str = "",
    workers: int = 1,
) -> tuple[Path, list[dict]]:
    """Run the suite against the named mutants of its adapter (all when `names` is empty), in
    `workers` processes; write the table (rows in the order of the mutant list, whatever `workers`)."""
    files = suite_files(protocol_paths)
    loaded = [read_protocol_file(f).load() for f in files]  # refuse a bad protocol before any run
    chosen = adapter_mutants(suite_adapter(loaded, files), tuple(names))
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    label = loaded[0].name if len(loaded) == 1 else "suite"
    root = Path(output) / f"mutate-{label}-{stamp}"
    root.mkdir(parents=True)
    roots = [root / m.name for m in chosen]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            table = list(pool.map(run_mutant, chosen, repeat(files), repeat(profile), roots, repeat(samples)))
    else:
        table = [run_mutant(m, files, profile, r, samples) for m, r in zip(chosen, roots)]
    for row in table:
        row["as_expected"] = expected_outcome(row)
    bundles.write_json(
        root / KILL_TABLE_JSON,
        {
            "protocols": [str(f) for f in files],
            "profile": profile,
            "samples_per_group": samples,
            "command": command,
            "rows": table,
        },
    )
    (root / KILL_TABLE_MD).write_text(render(table, command))
    return root, table
