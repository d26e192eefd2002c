"""Profile of a run's post-collection work (and of `specval verify`) on a kept bundle, step by step.

The run's analysis after collection (`analysis.analyse`, `lifecycle.write_manifest`, `runner.finish`)
is replayed on a copy of a kept bundle with its samples, so every CPU-side step runs on real data
at full size. The two GPU-side steps cannot run here: the reference replay of the occurring
prefixes and the quadrature sweeps (2^16 rows per pair) are timed separately on the CPU with the
protocol's SUT moved to the CPU (an estimate only, labelled "(CPU estimate)"), and the replayed
analysis reads the bundle's stored reference.json and quadrature.json in their place, so its
summary must equal the kept one: the table's last lines say whether summary.json, report.md and
report.html came out byte-identical (the manifest is written, timed, then replaced by the kept
one, so the reports render the kept code version and clock). The Monte Carlo draws equal the kept
ones only under the numpy and scipy the bundle was made with; `--against` compares with the files
another checkout's replay kept (`--keep`).

`--workers N` replays the run's pooled path (specval.report.figure_pool): the pool is started and
its workers have imported the plotting code before the clock starts (in a run they do that while
the SUT collects), the observed-vs-expected figures are handed to them once reference.json is
written, and the table shows the parent's side: the hand-over and the wait for the figures.

Each row is the wall time of one instrumented function, summed over its calls (column `calls`);
the rows do not nest, and `rest` is the step's wall time outside every instrumented function.

Usage, from the repository root:
    python -m benchmarks.analysis_profile [BUNDLE] [--no-gpu-steps] [--keep DIR] [--against DIR] [--workers N]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from specval import bundle as bundles
from specval import lifecycle, report
from specval.distribution import analysis, collect, criteria, laws, runner, stages, verdict
from specval.distribution.reference import Reference
from specval.report import plots
from specval.report.figure_pool import FigurePool

DEFAULT_BUNDLE = Path("reports/t2_cuda_batched-20261205T164638Z")
REGENERATED = (bundles.SUMMARY_FILE, bundles.MANIFEST_FILE, "report.md", "report.html", bundles.SUMS_FILE)
COMPARED = (bundles.SUMMARY_FILE, "report.md", "report.html")


class Clock:
    """Wall time per label, summed over calls, of functions patched in place for one `with` block."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, function: Callable, label: Callable[..., str]) -> Callable:
        @functools.wraps(function)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                name = label(*args, **kwargs)
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1

        return timed

    @contextlib.contextmanager
    def patched(self, targets: list[tuple[object, str, Callable[..., str]]]) -> Iterator[None]:
        saved = []
        for owner, attribute, label in targets:
            if hasattr(owner, attribute):  # a step another version of the code lacks is left out
                saved.append((owner, attribute, getattr(owner, attribute)))
                setattr(owner, attribute, self.wrap(getattr(owner, attribute), label))
        try:
            yield
        finally:
            for owner, attribute, original in reversed(saved):
                setattr(owner, attribute, original)


def _fixed(name: str) -> Callable[..., str]:
    return lambda *args, **kwargs: name


def _criterion(protocol, test, group, *args, **kwargs) -> str:
    return f"criterion {criteria.criterion_name(test, group)} (pooling + Monte Carlo)"


def _targets() -> list[tuple[object, str, Callable[..., str]]]:
    """The instrumented functions: none calls another of them."""
    return [
        (collect, "load_samples", _fixed("load samples (parquet)")),
        (report, "load_samples", _fixed("load samples (parquet)")),
        (verdict, "group_data", _fixed("group data (tokens, paths, validity counts)")),
        (verdict, "validity_tests", _fixed("validity criteria")),
        (verdict, "quadrature_criterion", _fixed("quadrature criteria (exact laws)")),
        (criteria, "_gof", _criterion),
        (criteria, "_homogeneity", _criterion),
        (verdict, "decide", _fixed("Holm and run verdict")),
        (verdict, "group_facts", _fixed("group facts (acceptance, sources)")),
        (plots, "observed_vs_expected", _fixed("plot: observed vs expected")),
        (plots, "pvalues_across_strata", _fixed("plot: p-values across strata")),
        (plots, "acceptance_by_position", _fixed("plot: token sources")),
        (FigurePool, "submit_observed", _fixed("figures: observed vs expected handed to the workers")),
        (FigurePool, "_wait", _fixed("figures: waited for the workers")),
        (report, "render_markdown", _fixed("report.md")),
        (report, "render_html", _fixed("report.html")),
        (bundles, "write_json", _fixed("json files written")),
        (bundles, "write_sums", _fixed("SHA256SUMS written")),
        (bundles, "check_sums", _fixed("SHA256SUMS checked")),
        (bundles, "check_all_chunks", _fixed("chunks.json checked")),
        (bundles, "code_version", _fixed("manifest facts (git, packages)")),
        (bundles, "package_versions", _fixed("manifest facts (git, packages)")),
    ]


def _stored(path: Path):
    """Stand-ins of the GPU-side steps: the bundle's own reference and quadrature laws."""
    reference = Reference.from_dict(bundles.read_json(path / bundles.REFERENCE_FILE))
    swept = bundles.read_json(path / bundles.QUADRATURE_FILE)
    return (lambda *args, **kwargs: reference), (lambda *args, **kwargs: swept)


@contextlib.contextmanager
def _stored_gpu_steps(path: Path) -> Iterator[None]:
    reference, swept = _stored(path)
    saved = (laws.reference_for, analysis.quadrature_laws)
    laws.reference_for, analysis.quadrature_laws = reference, swept  # where analysis.analyse looks them up
    try:
        yield
    finally:
        laws.reference_for, analysis.quadrature_laws = saved


class _NoSut:
    """What `analysis.analyse` needs of a SUT once the GPU-side steps read stored files."""

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt_ids = prompt_ids

    def encode(self, text: str) -> list[int]:
        return list(self.prompt_ids)


def replay_run(kept: Path, work: Path, against: Path, workers: int = 0) -> tuple[Clock, float, dict[str, bool]]:
    """The run's post-collection work on a copy of `kept`: (clock, wall s, file -> identical to the
    one in `against`); `workers` > 0: with a FigurePool of that many warm workers."""
    with FigurePool(workers) if workers > 0 else contextlib.nullcontext(None) as pool:
        if pool is not None:
            pool.worker_facts()  # warm before the clock: a run warms them while it collects
        return _replay(kept, work, against, pool)


def _replay(kept: Path, work: Path, against: Path, pool: FigurePool | None) -> tuple[Clock, float, dict[str, bool]]:
    path = work / kept.name
    shutil.copytree(kept, path)
    for name in REGENERATED:
        (path / name).unlink()
    manifest = bundles.read_json(kept / bundles.MANIFEST_FILE)
    protocol, ranges = runner.load_bundle_protocol(path)
    prompt = bundles.read_json(kept / bundles.REFERENCE_FILE)["prompt_token_ids"]
    timing = {k: manifest[k] for k in ("started", "finished", "wall_s", "collect_s", "samples_drawn", "samples_per_s")}
    clock = Clock()
    with _stored_gpu_steps(kept), clock.patched(_targets()):
        start = time.perf_counter()
        analysed = analysis.analyse(path, protocol, ranges, _NoSut(prompt), **({"pool": pool} if pool else {}))
        samples = getattr(analysed, "samples", None)  # code before the analysis kept its samples: None
        if pool is not None:
            pngs = pool.submit(path, analysed.summary, samples)()
        else:
            pngs = report.figures(path, analysed.summary, samples) if samples is not None else None
        lifecycle.write_manifest(
            path, protocol, ranges, manifest["device"], timing, manifest["command"], stages.stage2_ranges(path)
        )
        shutil.copyfile(kept / bundles.MANIFEST_FILE, path / bundles.MANIFEST_FILE)  # the kept code version
        runner.finish(path, pngs) if pngs is not None else runner.finish(path)
        wall = time.perf_counter() - start
    same = {name: (path / name).read_bytes() == (against / name).read_bytes() for name in COMPARED}
    return clock, wall, same


def replay_verify(kept: Path, workers: int | None = None) -> tuple[Clock, float, list[str]]:
    clock = Clock()
    with clock.patched(_targets()):
        start = time.perf_counter()
        problems = runner.verify(kept, workers)
        wall = time.perf_counter() - start
    return clock, wall, problems


def gpu_steps_on_cpu(kept: Path) -> dict[str, float]:
    """The reference replay of the bundle's occurring prefixes and the quadrature sweeps, with the
    protocol's SUT on the CPU (no adapter options: they size the batched GPU collection only)."""
    from specval.sut import open_sut

    protocol, ranges = runner.load_bundle_protocol(kept)
    spec = dataclasses.replace(protocol.sut, device="cpu", options=())
    sut = open_sut(spec, protocol.num_speculative_tokens)
    try:
        prompt_ids = sut.encode(protocol.prompt)
        samples = collect.load_samples(kept, ranges)
        tokens = samples[collect.token_columns(protocol.positions)].to_numpy(dtype=np.int64)
        sut.target_logits(prompt_ids)  # model load and first call, not part of the analysis
        start = time.perf_counter()
        laws.reference_for(sut, protocol, prompt_ids, tokens)
        replay = time.perf_counter() - start
        start = time.perf_counter()
        laws.quadrature_laws(sut, protocol, prompt_ids)
        sweeps = time.perf_counter() - start
    finally:
        sut.close()
    return {
        "reference replay of the occurring prefixes (CPU estimate)": replay,
        "quadrature sweeps (CPU estimate)": sweeps,
    }


def _table(title: str, clock: Clock, wall: float, extra: dict[str, float] | None = None) -> None:
    print(f"\n{title}\n")
    print("| step | calls | s |")
    print("| --- | ---: | ---: |")
    for name, seconds in sorted(clock.seconds.items(), key=lambda item: -item[1]):
        print(f"| {name} | {clock.calls[name]} | {seconds:.2f} |")
    print(f"| rest | | {wall - sum(clock.seconds.values()):.2f} |")
    print(f"| **total (wall)** | | **{wall:.2f}** |")
    for name, seconds in (extra or {}).items():
        print(f"| {name} | 1 | {seconds:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", nargs="?", type=Path, default=DEFAULT_BUNDLE)
    parser.add_argument(
        "--against",
        type=Path,
        help="compare the replayed files with those in this folder "
        "(default: the kept bundle; its Monte Carlo draws match only under its numpy and scipy)",
    )
    parser.add_argument("--keep", type=Path, help="copy the replayed summary and reports into this folder")
    parser.add_argument("--no-gpu-steps", action="store_true", help="skip the CPU estimate of the GPU-side steps")
    parser.add_argument("--workers", type=int, default=0, help="figure workers (0: the serial path)")
    args = parser.parse_args()
    kept = args.bundle
    extra = {} if args.no_gpu_steps else gpu_steps_on_cpu(kept)
    with tempfile.TemporaryDirectory() as work:
        clock, wall, same = replay_run(kept, Path(work), args.against or kept, args.workers)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for name in COMPARED:
                shutil.copyfile(Path(work) / kept.name / name, args.keep / name)
    _table(f"run, after collection: {kept.name}", clock, wall, extra)
    print(
        f"\nidentical to {args.against or kept}: " + ", ".join(f"{n} {'yes' if s else 'NO'}" for n, s in same.items())
    )
    clock, wall, problems = replay_verify(kept, args.workers or None)
    _table(f"specval verify {kept.name}", clock, wall)
    print(f"\nverify: {'OK' if not problems else f'{len(problems)} difference(s), first: {problems[0]}'}")


if __name__ == "__main__":
    main()
