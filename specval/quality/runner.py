"""Paired quality runs: the same items and seeds through every group, exact McNemar, non-inferiority.

    protocol -> one seed range (ledger) -> completions per group (SUT) -> scores -> paired comparisons
             -> verdict -> report -> manifest -> SHA256SUMS

Pairing: unit (item i, seed j) gets request seed `start + i * seeds_per_item + j` in EVERY group, so
a group's correctness vector is paired element-wise with every other group's. The ledger holds one
range per run (group "paired"), so runs never reuse seeds.

Verdict of a comparison of group b against group a (`specval.stats.mcnemar.paired_comparison`, a
two-sided 1 - alpha Newcombe interval [lo, hi] on acc_b - acc_a, pre-registered margin m: the
resolved protocol's, i.e. the profile's when the profile sets one, in the run and in `verify` alike):
PASS iff lo > -m (non-inferior); FAIL iff hi < -m (a regression larger than m is established);
otherwise INCONCLUSIVE (the interval is too wide to decide). The run PASSes iff every primary
comparison PASSes, FAILs if any FAILs, and is INCONCLUSIVE otherwise; secondary comparisons never gate.
Error rates: each primary claim of non-inferiority is wrong with probability about alpha / 2 when
the true regression is >= m (the run needs all of them, so the false-PASS rate is about alpha / 2);
a SUT with no regression FAILs a comparison with probability <= alpha / 2 (<= alpha / 2 x number of
primary comparisons for the run). A non-significant McNemar alone is NOT evidence of no regression.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specval import bundle as bundles
from specval import lifecycle, seeds
from specval.execution import guard_bundle
from specval.preflight import GuardedSUT, check_capabilities, check_writable_dir, open_guarded
from specval.protocol import check_registered
from specval.quality.protocol import QualityProtocol, arith_config, load_quality_protocol, parse_quality_protocol
from specval.quality.protocol import resolve as resolve_profile
from specval.quality.report import render, render_files
from specval.stats.mcnemar import paired_comparison
from specval.sut import SUTError, SutFactory, open_sut

PAIRED_GROUP = "paired"  # the ledger's group name of a quality run's one seed range
SAMPLES_DIR = "samples"
PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"


# ---------------------------------------------------------------- items and scoring


def load_items(protocol: QualityProtocol) -> tuple:
    """The protocol's first `num_items` items (deterministic)."""
    if protocol.task.name == "arith":
        from specval.tasks.arith import generate

        return generate(arith_config(dict(protocol.task.options), protocol.num_items))
    from specval.tasks.gsm8k import load_gsm8k

    return load_gsm8k(limit=protocol.num_items)


def item_prompt(protocol: QualityProtocol, item, sut) -> str:
    """The text prompt of one item in the protocol's prompt format."""
    task, chat = protocol.task, protocol.task.prompt_format == "chat"
    if task.name == "arith":
        from specval.tasks import arith

        config = arith_config(dict(task.options), protocol.num_items)
        return sut.render_chat(arith.chat_messages(item, config)) if chat else arith.prompt(item, config)
    from specval.tasks import gsm8k

    return sut.render_chat(gsm8k.chat_messages(item)) if chat else item.fewshot_context


def score(protocol: QualityProtocol, item, completion: str) -> bool:
    """Correctness of one completion under the protocol's metric."""
    if protocol.task.name == "arith":
        from specval.tasks import arith

        return arith.score(completion, item)
    from specval.tasks import gsm8k

    stops = gsm8k.CHAT_STOP_SEQUENCES if protocol.task.prompt_format == "chat" else gsm8k.STOP_SEQUENCES
    result = gsm8k.score(completion, item, stops)
    return result.flexible_correct if protocol.task.metric == "flexible_extract" else result.strict_correct


def unit_seeds(protocol: QualityProtocol, start: int) -> np.ndarray:
    """int64[items * seeds]: the request seed of unit (i, j) at index i * seeds_per_item + j."""
    return start + np.arange(protocol.num_pairs, dtype=np.int64)


# ---------------------------------------------------------------- collection


def _samples_file(path: Path, group: str) -> Path:
    return path / SAMPLES_DIR / f"{group}.json"


def collect(sut, protocol: QualityProtocol, start: int, path: Path, progress: bool) -> int:
    """Write samples/<group>.json for every group not yet complete; returns the completions drawn."""
    items = load_items(protocol)
    prompts = [item_prompt(protocol, item, sut) for item in items for _ in range(protocol.seeds_per_item)]
    seed_list = unit_seeds(protocol, start)
    (path / SAMPLES_DIR).mkdir(exist_ok=True)
    drawn = 0
    for group in protocol.groups:
        if _samples_file(path, group.name).exists():
            continue  # complete (written atomically): resume skips it
        rows = []
        with tqdm(
            total=len(prompts), unit="completion", disable=not progress, desc=f"{protocol.name}:{group.name}"
        ) as bar:
            for lo in range(0, len(prompts), protocol.batch_size):
                batch = slice(lo, lo + protocol.batch_size)
                outs = sut.complete(group, prompts[batch], protocol.sampling, seed_list[batch], protocol.max_tokens)
                rows += [
                    _row(unit, int(seed), out)
                    for unit, seed, out in zip(range(lo, lo + len(outs)), seed_list[batch], outs)
                ]
                bar.update(len(outs))
        bundles.write_json_chunk(path, _samples_file(path, group.name), rows)  # integrity: hash recorded
        drawn += len(rows)
    return drawn


def _row(unit: int, seed: int, out) -> dict:
    return {
        "unit": unit,
        "seed": seed,
        "completion": out.text,
        "num_tokens": out.num_tokens,
        "num_draft_tokens": out.num_draft_tokens,
        "num_accepted_tokens": out.num_accepted_tokens,
        "finish_reason": out.finish_reason,
    }


# ---------------------------------------------------------------- statistics and verdict


def correctness(protocol: QualityProtocol, rows: list[dict]) -> np.ndarray:
    """bool[items * seeds] of one group, re-scored from the stored completion texts."""
    items = load_items(protocol)
    if [r["unit"] for r in rows] != list(range(protocol.num_pairs)):
        raise bundles.BundleError(f"samples do not hold units 0..{protocol.num_pairs - 1} in order")
    return np.array(
        [score(protocol, items[r["unit"] // protocol.seeds_per_item], r["completion"]) for r in rows], dtype=bool
    )


def comparison_verdict(ci_low: float, ci_high: float, margin: float) -> tuple[str, str]:
    """PASS (non-inferior), FAIL (regression beyond the margin) or INCONCLUSIVE, with the reason."""
    if ci_low > -margin:
        return PASS, f"non-inferior: CI low {ci_low:+.4f} > -margin {-margin:+.4f}"
    if ci_high < -margin:
        return FAIL, f"regression beyond the margin: CI high {ci_high:+.4f} < -margin {-margin:+.4f}"
    return INCONCLUSIVE, (
        f"CI [{ci_low:+.4f}, {ci_high:+.4f}] contains -margin {-margin:+.4f}: too wide to "
        "decide; a non-significant McNemar alone is not evidence of no regression"
    )


def compare(protocol: QualityProtocol, role: str, a: str, b: str, flags: dict[str, np.ndarray]) -> dict:
    """One paired comparison of group b against group a: McNemar, CI, margin, verdict."""
    result = paired_comparison(flags[a], flags[b], alpha=protocol.alpha, margin=protocol.margin)
    verdict, reason = comparison_verdict(result.ci_low, result.ci_high, protocol.margin)
    return {
        "kind": "mcnemar_noninferiority",
        "role": role,
        "group_a": a,
        "group_b": b,
        "n": result.n,
        "wins": result.wins,
        "losses": result.losses,
        "ties": result.ties,
        "acc_a": result.acc_a,
        "acc_b": result.acc_b,
        "diff": result.diff,
        "statistic": result.wins - result.losses,
        "p_value": result.p_value,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        "alpha": result.alpha,
        "margin": protocol.margin,
        "certifiable_margin": max(0.0, -result.ci_low),
        "verdict": verdict,
        "reason": reason,
    }


def _group_facts(protocol: QualityProtocol, name: str, rows: list[dict], flags: np.ndarray, start: int) -> dict:
    group = next(g for g in protocol.groups if g.name == name)
    drafted = sum(r["num_draft_tokens"] for r in rows)
    accepted = sum(r["num_accepted_tokens"] for r in rows)
    return {
        "mode": group.mode,
        "draft_loops": group.draft_loops,
        "planned_n": protocol.num_pairs,
        "effective_n": len(rows),
        "accuracy": float(flags.mean()),
        "num_correct": int(flags.sum()),
        "seed_start": start,
        "seed_stop": start + protocol.num_pairs,
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_tokens": float(np.mean([r["num_tokens"] for r in rows])),
    }


def overall(tests: dict[str, dict]) -> tuple[str, str]:
    """PASS iff every primary comparison passes; FAIL if one fails; else INCONCLUSIVE."""
    primary = {n: t["verdict"] for n, t in tests.items() if t["role"] == "primary"}
    failed = sorted(n for n, v in primary.items() if v == FAIL)
    if failed:
        return FAIL, f"regression beyond the margin in {', '.join(failed)}"
    open_ = sorted(n for n, v in primary.items() if v != PASS)
    if open_:
        return INCONCLUSIVE, (
            f"non-inferiority not established for {', '.join(open_)} (CI too wide at this n); not a PASS"
        )
    return PASS, f"every primary comparison is non-inferior within the margin ({len(primary)} comparison(s))"


def summarise(path: Path, protocol: QualityProtocol, start: int) -> dict:
    """The summary computed from the bundle's raw completions alone."""
    rows = {g.name: bundles.read_json(_samples_file(path, g.name)) for g in protocol.groups}
    flags = {name: correctness(protocol, group_rows) for name, group_rows in rows.items()}
    tests = {
        f"noninferiority.{b}_vs_{a}": compare(protocol, role, a, b, flags) for role, a, b in protocol.comparisons()
    }
    verdict, reason = overall(tests)
    registration = bundles.RunPlan.from_dict(bundles.read_json(path / bundles.RUN_FILE)).registration_block()
    return json.loads(
        json.dumps(
            {
                "kind": "quality",
                "verdict": verdict,
                "reason": reason,
                "tests": tests,
                "registration": registration,
                "groups": {name: _group_facts(protocol, name, rows[name], flags[name], start) for name in rows},
                "protocol": {
                    "name": protocol.name,
                    "hash": protocol.hash,
                    "profile": protocol.profile,
                    "alpha": protocol.alpha,
                    "margin": protocol.margin,
                    "task": protocol.task.name,
                    "metric": protocol.task.metric,
                    "prompt_format": protocol.task.prompt_format,
                    "num_items": protocol.num_items,
                    "seeds_per_item": protocol.seeds_per_item,
                    "max_tokens": protocol.max_tokens,
                    "baseline": protocol.baseline,
                },
            }
        )
    )


# ---------------------------------------------------------------- the run


def _start(
    protocol_file: Path,
    base: QualityProtocol,
    protocol: QualityProtocol,
    output: Path,
    seed_offset: int | None,
    registration: str,
    exploratory: bool,
) -> tuple[Path, seeds.SeedRange]:
    """Claim one seed range for all groups (under the ledger lock) and create the bundle."""
    groups, size = [PAIRED_GROUP], protocol.num_pairs
    path, (claimed,) = lifecycle.start_bundle(
        protocol_file, base, protocol, output, groups, size, seed_offset, registration, exploratory
    )
    return path, claimed


def load_bundle_protocol(path: Path) -> tuple[QualityProtocol, seeds.SeedRange]:
    """The resolved protocol and the seed range a quality bundle was (or is being) run with;
    BundleError unless protocol.yaml, protocol.json and run.json record the same protocol."""
    protocol, plan = bundles.load_plan_protocol(path, parse_quality_protocol, load_quality_protocol)
    ((group, start, stop),) = plan.ranges
    return resolve_profile(protocol, plan.profile), seeds.SeedRange(plan.protocol, path.name, group, start, stop)


def _open(protocol: QualityProtocol, protocol_file: Path, sut_factory: SutFactory | None) -> GuardedSUT:
    sut = open_guarded(sut_factory or open_sut, protocol)
    try:
        if not (hasattr(sut, "complete") and hasattr(sut, "render_chat")):
            raise SUTError(
                f"sut.adapter {protocol.sut.adapter!r} cannot generate text completions "
                "(needs complete() and render_chat()); quality protocols need it"
            )
        sut.check_groups(protocol.groups)  # refuse unsupported groups before claiming any seed
        check_capabilities(protocol, sut, protocol_file)
    except BaseException:
        sut.close()
        raise
    return sut


def run(
    protocol_file: Path | None,
    profile: str | None,
    output: Path,
    *,
    resume: Path | None = None,
    exploratory: bool = False,
    seed_offset: int | None = None,
    progress: bool = True,
    sut_factory: SutFactory | None = None,
    command: list[str] | None = None,
    announce: Callable[[Path], None] | None = None,
    parsed: QualityProtocol | None = None,
) -> tuple[Path, dict]:
    """Run (or resume) a quality protocol and write a sealed bundle; returns (bundle, summary).
    Refusals, failures and interrupts behave as in `specval.distribution.runner.run`; `parsed`: the
    protocol of `protocol_file` when the caller has parsed it already (None: read here)."""
    started, clock = dt.datetime.now(dt.timezone.utc).isoformat(), time.perf_counter()
    if resume is None:
        base = parsed if parsed is not None else load_quality_protocol(protocol_file)
        state = check_registered(base, protocol_file, exploratory)
        protocol = resolve_profile(base, profile)
    else:
        bundles.check_resumable(Path(resume))  # integrity: refuse sealed or tampered bundles (lead: keep)
        protocol, claimed = load_bundle_protocol(Path(resume))
    check_writable_dir(Path(output if resume is None else resume), "--output" if resume is None else "--resume")
    sut = _open(protocol, Path(protocol_file or Path(resume) / bundles.PROTOCOL_YAML), sut_factory)
    try:
        if resume is None:
            path, claimed = _start(Path(protocol_file), base, protocol, output, seed_offset, state, exploratory)
        else:
            path = Path(resume)
        if announce:
            announce(path)
        session = bundles.begin_session(path, command)
        with guard_bundle(path, session):
            t0 = time.perf_counter()
            drawn = collect(sut, protocol, claimed.start, path, progress)
            collect_s = time.perf_counter() - t0
            device = {**bundles.device_facts(), "sut": sut.describe()}
    finally:
        sut.close()
    summary = summarise(path, protocol, claimed.start)
    bundles.write_json(path / bundles.SUMMARY_FILE, summary)
    bundles.end_session(path, session, drawn, summary["verdict"])  # integrity (lead: keep on merge)
    lifecycle.write_manifest(
        path, protocol, [claimed], device, lifecycle.run_timing(started, clock, collect_s, drawn), command
    )
    finish(path)
    return path, summary


def finish(path: Path) -> None:
    """Render report.md / report.html and seal the bundle with SHA256SUMS (temp files of a
    killed process removed first)."""
    render(path)
    lifecycle.seal(path)


def verify(path: Path) -> list[str]:
    """Every difference between the bundle and its seals, its summary recomputed from the stored
    completion texts (re-scored, re-compared) and its reports re-rendered (`bundles.verify_bundle`)."""
    return bundles.verify_bundle(path, _recompute_bundle, render_files)


def _recompute_bundle(path: Path) -> dict:
    protocol, claimed = load_bundle_protocol(path)
    return summarise(path, protocol, claimed.start)
