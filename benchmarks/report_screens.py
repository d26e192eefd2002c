"""First screens of every kind's report in headless Chromium: what a reviewer sees of report.html
without scrolling, photographed and checked.

    python -m benchmarks.report_screens --output results/report_screens [--bundle BUNDLE ...]

Without --bundle it first makes one small bundle of each kind that has a report
(tests/fixtures/report_bundles.py: distribution and performance signed by `run --sign`, sequence
run exploratory and signed by `specval sign`, quality unsigned; seconds on one core) under
OUTPUT/bundles. For each report.html it writes OUTPUT/<kind>.png, the first screen of a 1280 x 900
window, and checks that the text the browser lays out wholly inside that screen shows the
verdict, frozen or exploratory, the system under test's digest, what was tested, what a PASS does
not cover and the signer (`report_bundles.first_screen_items`). Prints one markdown row per report
and writes OUTPUT/report_screens.json. Exit 0 when every first screen shows every item, 1 when one
does not, 2 for a --bundle that is not a sealed bundle, 5 when no Chromium is found
($SPECVAL_CHROMIUM, else chromium / chromium-browser / google-chrome on PATH) or it fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specval import bundle as bundles
from specval.exits import EXIT_ENVIRONMENT, EXIT_FAIL, EXIT_INPUT, EXIT_PASS
from specval.kinds import bundle_kind
from tests.fixtures import chromium
from tests.fixtures.report_bundles import first_screen_items, missing_items, report_bundles

HEADER = "| kind | bundle | first screen shows | missing | screenshot |\n| --- | --- | --- | --- | --- |"
RESULTS_FILE = "report_screens.json"


def _given(paths: list[Path]) -> list[tuple[str, Path]]:
    """(kind, bundle) of each --bundle; exit 2 naming the first that is not a sealed bundle."""
    out = []
    for path in paths:
        if not (path / bundles.SUMS_FILE).is_file() or not (path / "report.html").is_file():
            print(f"error: --bundle {path}: not a sealed bundle with a report.html", file=sys.stderr)
            sys.exit(EXIT_INPUT)
        out.append((bundle_kind(path).name, path))
    return out


def check(binary: str, kind: str, path: Path, output: Path) -> dict:
    """Screenshot and check the first screen of one bundle's report.html."""
    page = path / "report.html"
    png = chromium.screenshot(binary, page, output / f"{kind}.png")
    items = first_screen_items(path)
    shown = "\n".join(chromium.first_screen_texts(binary, page))
    missing = missing_items(items, shown)
    return {"kind": kind, "bundle": str(path), "items": list(items), "missing": missing, "screenshot": str(png)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="Folder of the screenshots and results.")
    parser.add_argument("--bundle", type=Path, action="append", default=[], help="A sealed bundle (repeatable).")
    args = parser.parse_args(argv)
    binary = chromium.find_chromium()
    if binary is None:
        print(f"error: environment: no Chromium (set {chromium.BINARY_VARIABLE} or install chromium)", file=sys.stderr)
        return EXIT_ENVIRONMENT
    args.output.mkdir(parents=True, exist_ok=True)
    given = _given(args.bundle)
    if not given:
        (args.output / "bundles").mkdir(exist_ok=True)
        given = [(made.kind, made.path) for made in report_bundles(args.output / "bundles")]
    print(HEADER)
    rows = []
    for kind, path in given:
        try:
            row = check(binary, kind, path, args.output)
        except chromium.BrowserError as err:
            print(f"error: environment: {err}", file=sys.stderr)
            return EXIT_ENVIRONMENT
        rows.append(row)
        shown = ", ".join(item for item in row["items"] if item not in row["missing"])
        print(f"| {kind} | {path.name} | {shown} | {', '.join(row['missing']) or '-'} | {row['screenshot']} |")
    (args.output / RESULTS_FILE).write_text(json.dumps(rows, indent=1) + "\n")
    return EXIT_FAIL if any(row["missing"] for row in rows) else EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
