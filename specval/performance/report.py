"""Report of a bench bundle: verdict, median ratio and its interval, pairs, arms, provenance."""

from __future__ import annotations

from pathlib import Path

from specval.report import Section, summary_files
from specval.report.markdown import fmt
from specval.report.scope import profile_setting

RATIO_HEADER = ["pairs", "median ratio b / a", "interval", "order statistics", "exact coverage", "threshold", "verdict"]
PAIR_HEADER = ["pair", "order", "a", "b", "ratio b / a"]
ARM_HEADER = [
    "arm",
    "name",
    "mode",
    "draft loops",
    "eager",
    "rounds in flight",
    "sampling (T, top-k, top-p)",
    "timed runs",
    "median",
    "min",
    "max",
    "acceptance rate",
    "rounds per request",
]
METHOD = (
    "The interval is the exact distribution-free confidence interval for the median ratio: the k-th smallest "
    "and k-th largest of the n pair ratios, with k the largest rank whose coverage 1 - 2 P(Bin(n, 1/2) <= k - 1) "
    "(scipy.stats.binom) is at least the confidence. It assumes independent pairs from one distribution and "
    "nothing about its shape. A PASS when the true median ratio is on the wrong side of the threshold (or a "
    "FAIL when it is on the right side) happens with probability at most P(Bin(n, 1/2) <= k - 1)."
)
VERIFY_NOTE = (
    "Timings cannot be re-measured: `specval verify` re-hashes every file and recomputes the schedule "
    "check, every ratio, the median, the interval and the verdict from the raw timings in "
    "samples/timings.csv; it shows that the bundle is consistent, not that the machine measured those "
    "times."
)


def ratio_rows(summary: dict) -> list[list[str]]:
    r = summary["ratio"]
    return [
        [
            str(r["n"]),
            fmt(r["median"]),
            f"[{r['low']:.4f}, {r['high']:.4f}]",
            f"k = {r['rank']}: x_({r['rank']}), x_({r['n'] - r['rank'] + 1})",
            f"{r['coverage']:.4f} (asked {r['confidence']:g})",
            fmt(summary["threshold"]),
            summary["verdict"],
        ]
    ]


def pair_rows(summary: dict) -> list[list[str]]:
    return [[str(p["pair"]), p["order"], fmt(p["a"]), fmt(p["b"]), fmt(p["ratio"])] for p in summary["pairs"]]


def arm_rows(summary: dict) -> list[list[str]]:
    return [
        [
            key,
            a["name"],
            a["mode"],
            fmt(a["draft_loops"]),
            fmt(a["enforce_eager"]),
            fmt(a["rounds_in_flight"]),
            f"{a['temperature']:g}, {a['top_k']}, {a['top_p']:g}",
            str(a["runs"]),
            fmt(a["median"]),
            fmt(a["min"]),
            fmt(a["max"]),
            fmt(a["acceptance_rate"], 3),
            fmt(a["rounds_per_request"], 4),
        ]
        for key, a in sorted(summary["arms"].items())
    ]


def _facts(summary: dict, manifest: dict) -> list[str]:
    proto, order = summary["protocol"], summary["order_effect"]
    side = "above" if proto["statistic"] == "throughput" else "below"
    engines = manifest.get("device", {}).get("engines", {})
    graphs = "; ".join(f"{key}: {e['graphs']}" for key, e in sorted(engines.items())) or "-"
    return [
        f"workload: {proto['concurrency']} concurrent request(s) x {proto['max_tokens']} tokens "
        f"({proto['num_prompts']} prompt(s)), {_adapter(proto)}{proto['model']} {proto['dtype']} "
        f"on {proto['device']}, "
        f"K = {proto['num_speculative_tokens']}",
        f"statistic: {proto['statistic']} ratio b / a, {proto['statistic_meaning']}",
        f"pre-registered: {proto['hypothesis']}, margin {proto['margin']:g}: PASS iff the interval lies {side} "
        f"{summary['threshold']:.4f}, FAIL iff it lies entirely on the other side, else INCONCLUSIVE",
        f"ABBA order: {proto['warmup_rounds']} warm-up round(s) per arm (excluded), then {proto['pairs']} pairs; "
        f"median ratio of a-first pairs {fmt(order['median_ratio_ab'])}, of b-first pairs "
        f"{fmt(order['median_ratio_ba'])}",
        f"CUDA Graphs: {graphs}; timed runs that captured graphs: {summary['timed_runs_capturing_graphs']}",
    ]


def _adapter(proto: dict) -> str:
    """ "adapter NAME: " for a bench of another adapter than the engine (engine reports read as before)."""
    return f"adapter {proto['adapter']}: " if "adapter" in proto else ""


def _sections(summary: dict, manifest: dict) -> list[Section]:
    return [
        Section("Median ratio", RATIO_HEADER, ratio_rows(summary), (METHOD, VERIFY_NOTE)),
        Section("Pairs", PAIR_HEADER, pair_rows(summary)),
        Section("Arms", ARM_HEADER, arm_rows(summary)),
    ]


NOT_COVERED = (
    "a PASS does not cover: other workloads (concurrency, prompts, output lengths, sampling), other "
    "models, dtypes, devices or machines, engine settings other than the two arms', the mean or the "
    "tail of the timings (the median ratio is tested), absolute speed (the ratio is relative to arm "
    "a), and whether either arm's output is right (distribution and sequence protocols test that)"
)


def arm_text(key: str, arm: dict) -> str:
    """One arm as the scope names it: key, name, mode and the settings the arms table lists."""
    settings = [arm["mode"]]
    settings += [f"draft loops {arm['draft_loops']}"] if arm.get("draft_loops") is not None else []
    settings += ["eager"] if arm.get("enforce_eager") else []
    settings += [f"{arm['rounds_in_flight']} rounds in flight"] if arm.get("rounds_in_flight") is not None else []
    return f"{key} = {arm['name']} ({', '.join(settings)})"


def tested_text(summary: dict, protocol: dict) -> str:
    """What a bench tested: the two arms, the adapter, model and device, the workload and the pairs."""
    proto, arms = summary["protocol"], summary["arms"]
    adapter = (profile_setting(protocol, proto["profile"], "sut") or {}).get("adapter")
    return (
        f"tested: arm {arm_text('b', arms['b'])} against arm {arm_text('a', arms['a'])} (sampling and "
        f"counts in the Arms table), through adapter {adapter}, model {proto['model']} {proto['dtype']} "
        f"on {proto['device']}, K = {proto['num_speculative_tokens']}; workload {proto['concurrency']} "
        f"concurrent request(s) x {proto['max_tokens']} tokens over {proto['num_prompts']} prompt(s); "
        f"{proto['pairs']} ABBA pairs after {proto['warmup_rounds']} warm-up round(s) per arm"
    )


def render_files(path: Path, signer: str | None = None) -> dict[str, bytes]:
    """report.md and report.html of the bench bundle at `path`, from its files alone
    (deterministic; `signer`: as `specval.report.render_files`)."""
    return summary_files(path, _facts, _sections, NOT_COVERED, tested_text, signer)
