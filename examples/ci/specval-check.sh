#!/usr/bin/env bash
# specval in a team's CI: install specval (the harness alone: no torch, no triton), run the smoke (or
# ci) profile of the team's frozen protocol or suite (`kind: suite`), keep the bundles and the JUnit
# file for upload, write the step summary, and exit with specval's exit code, so the job fails on
# anything but PASS. Called by specval.yml (GitHub Actions) and gitlab-ci.yml (GitLab CI); any CI can
# call it the same way.
#
# Environment (only SPECVAL_PROTOCOL is required):
#   SPECVAL_PROTOCOL      the protocol or suite file (frozen in the frozen.lock beside it)
#   SPECVAL_PROFILE       its profile (default: smoke); a suite runs every member with it
#   SPECVAL_OUTPUT        folder of the bundles, the seed ledger, junit.xml, bundle.txt, specval.log
#                         and summary.md (default: specval-results; created); upload it as the job's
#                         artifact
#   SPECVAL_PACKAGE       what pip installs: the specval you pinned (a wheel you keep, or a git URL at a
#                         tag), without extras: the harness needs no torch (about 680 MB with its
#                         dependencies); add [engine] only to test specval's own bundled engine;
#                         required unless SPECVAL_SKIP_INSTALL=1
#   SPECVAL_TORCH         optional: a torch version pip installs first, for an engine of yours that
#                         needs torch (specval needs none); unset: no torch unless your package brings it
#   SPECVAL_SKIP_INSTALL  1: use the specval already installed for SPECVAL_PYTHON (no pip)
#   SPECVAL_PYTHON        the interpreter (default: python3)
#   SPECVAL_ARGS          extra arguments of `specval run` (word-split)
# The adapter named by the protocol's sut.adapter must be importable (installed, or on PYTHONPATH).
#
# Output, in SPECVAL_OUTPUT: junit.xml (a single protocol: one <testsuite>; a suite: <testsuites>
# with one <testsuite> per member run), bundle.txt (every bundle made, one path a line; empty when
# none was), specval.log (what specval printed) and summary.md (the verdict; per bundle its engine,
# frozen state, scope and what a PASS does not cover, and each failing criterion with its size:
# statistic, Holm p, MDE, sample size, worst case, stratum or bucket). summary.md is appended to
# $GITHUB_STEP_SUMMARY when set; $GITHUB_OUTPUT gets `bundle` (the bundle, or the suite's directory:
# what `specval verify` takes) and `exit-code`.
#
# Exit status: specval's (0 PASS; 1 FAIL; 2 input error, nothing claimed; 3 the adapter raised, the
# bundle is kept; 4 INCONCLUSIVE and 5 environment error where the installed specval has them;
# 130 interrupted; a suite: its most severe member's); 2 when SPECVAL_PROTOCOL or SPECVAL_PACKAGE is
# missing, 5 when pip fails.
set -uo pipefail

python="${SPECVAL_PYTHON:-python3}"
protocol="${SPECVAL_PROTOCOL:-}"
profile="${SPECVAL_PROFILE:-smoke}"
output="${SPECVAL_OUTPUT:-specval-results}"
EXIT_INPUT=2
EXIT_ENVIRONMENT=5

install_specval() {
  if [ "${SPECVAL_SKIP_INSTALL:-0}" = 1 ]; then
    return 0
  fi
  if [ -z "${SPECVAL_PACKAGE:-}" ]; then
    echo "specval-check: SPECVAL_PACKAGE is not set (what pip installs), nor SPECVAL_SKIP_INSTALL=1" >&2
    exit "$EXIT_INPUT"
  fi
  if [ -n "${SPECVAL_TORCH:-}" ]; then
    "$python" -m pip install -q "torch==${SPECVAL_TORCH}" || exit "$EXIT_ENVIRONMENT"
  fi
  "$python" -m pip install -q "$SPECVAL_PACKAGE" || exit "$EXIT_ENVIRONMENT"
}

# Every bundle path specval printed (`bundle: PATH` and `bundle: PATH (resume with: ...)`), once each,
# in the order the bundles were made.
bundles_of() {
  sed -n '/^bundle: /{s/^bundle: //;s/ (resume with: .*)$//;p;}' "$1" | awk '!seen[$0]++'
}

# What `specval verify` takes: the suite's directory (from its record line), else the last bundle.
evidence_of() {
  local suite
  suite="$(sed -n 's/^[A-Z]*: suite .* member(s) run; record: \(.*\)\/suite\.json$/\1/p' "$1" | tail -n 1)"
  if [ -n "$suite" ]; then echo "$suite"; else tail -n 1 "$2"; fi
}

# The step summary (markdown) of the run, from the bundles' summary.json and report.md.
# Arguments: exit status, protocol, profile, bundle.txt, specval.log.
summarize() {
  "$python" - "$@" <<'PY'
import json
import sys
from pathlib import Path

SCOPE_PREFIXES = ("- system under test", "- frozen", "- EXPLORATORY", "- registration", "- tested:",
                  "- a PASS does not cover")
LOG_TAIL_LINES = 3


def cell(text):
    """Text for one markdown table cell: one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def number(value):
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def worst_pair(test):
    """Quadrature: the case whose swept law is furthest from the exact law."""
    pairs = test.get("pairs") or {}
    if not pairs:
        return None
    name, pair = max(pairs.items(), key=lambda item: item[1].get("max_abs_error") or 0.0)
    limit = (pair.get("resolution") or 0.0) + (pair.get("allowance") or 0.0)
    return f"worst case {name}: max abs error {number(pair.get('max_abs_error'))} (limit {number(limit)})"


def worst_stratum(test):
    """Goodness of fit: the stratum of smallest p-value."""
    strata = [s for s in test.get("strata") or [] if s.get("p_value") is not None]
    if not strata:
        return None
    worst = min(strata, key=lambda s: s["p_value"])
    return f"worst stratum (prefix {worst.get('prefix')}): n {number(worst.get('n'))}, p {number(worst['p_value'])}"


def worst_bucket(test):
    """PIT families: the bucket the criterion names as worst, with its size and MDE."""
    keys, key = test.get("bucket_keys") or [], test.get("worst_bucket")
    if key not in keys:
        return None
    i = keys.index(key)
    parts = [f"worst bucket {key}"]
    for label, field in (("n", "bucket_sizes"), ("statistic", "bucket_statistics"), ("MDE", "bucket_mde")):
        values = test.get(field) or []
        if i < len(values) and values[i] is not None:
            parts.append(f"{label} {number(values[i])}")
    return ", ".join(parts)


def size(test):
    """How big the deviation is, from the criterion's figures in summary.json."""
    figures = [("statistic", test.get("statistic")), ("p (Holm)", test.get("p_adjusted")),
               ("MDE (TV)", test.get("mde_tv")), ("n", test.get("effective_n", test.get("n")))]
    parts = [f"{label} {number(value)}" for label, value in figures if value is not None]
    parts += [text for text in (worst_pair(test), worst_stratum(test), worst_bucket(test)) if text]
    return "; ".join(parts) or "-"


def failing(summary):
    """Gating criteria that fail the run (after a second stage: those it confirmed), then the INCONCLUSIVE."""
    tests = summary.get("tests") or {}
    gating = ("control", "primary")
    if "confirmation" in summary:
        failed = set(summary["confirmation"].get("failing") or [])
    else:
        failed = {n for n, t in tests.items() if t.get("verdict") == "FAIL" and t.get("role") in gating}
    undecided = {n for n, t in tests.items() if t.get("verdict") == "INCONCLUSIVE" and t.get("role") in gating}
    return [(n, tests[n]) for n in sorted(failed) + sorted(undecided - failed) if n in tests]


def scope(bundle):
    """The first screen's scope lines of the bundle's report.md (none for an older bundle)."""
    report = bundle / "report.md"
    if not report.is_file():
        return []
    return [line for line in report.read_text(encoding="utf-8").splitlines() if line.startswith(SCOPE_PREFIXES)]


def bundle_section(bundle):
    summary_file = bundle / "summary.json"
    if not summary_file.is_file():
        return [f"#### `{bundle}`: no verdict", "", "The run ended before its verdict (see specval.log).", ""]
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    name = (summary.get("protocol") or {}).get("name", bundle.name)
    lines = [f"#### {name}: {summary.get('verdict')}", "", f"`{bundle}`: {cell(summary.get('reason', ''))}", ""]
    lines += scope(bundle) + [""]
    rows = failing(summary)
    if rows:
        lines += ["| criterion | role | verdict | size | reason |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {t.get('role')} | {t.get('verdict')} | {cell(size(t))} | {cell(t.get('reason', ''))} |"
                  for n, t in rows]
        lines.append("")
    return lines


def main(code, protocol, profile, bundle_list, log):
    bundles = [Path(line) for line in Path(bundle_list).read_text(encoding="utf-8").splitlines() if line]
    verdict = [line for line in Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
               if line.startswith(("PASS", "FAIL", "INCONCLUSIVE", "INTERRUPTED", "EXPLORATORY", "error:"))]
    lines = [f"### specval: {protocol} ({profile}), exit {code}", ""]
    lines += [f"**{cell(verdict[-1])}**" if verdict else "**no verdict**", ""]
    for bundle in bundles:
        lines += bundle_section(bundle)
    if not bundles:
        tail = Path(log).read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:]
        lines += ["No bundle was made:", "", "```", *tail, "```", ""]
    print("\n".join(lines))


main(*sys.argv[1:])
PY
}

if [ -z "$protocol" ]; then
  echo "specval-check: SPECVAL_PROTOCOL is not set (the protocol file to run)" >&2
  exit "$EXIT_INPUT"
fi
install_specval

mkdir -p "$output"
log="$output/specval.log"
junit="$output/junit.xml"
rm -f "$junit"  # a file left by an earlier run must not pass for this one's
# shellcheck disable=SC2086  # SPECVAL_ARGS is a list of arguments
"$python" -m specval run "$protocol" --profile "$profile" --output "$output" --junit "$junit" --quiet \
  ${SPECVAL_ARGS:-} 2>&1 | tee "$log"
code="${PIPESTATUS[0]}"

bundles_of "$log" > "$output/bundle.txt"
evidence="$(evidence_of "$log" "$output/bundle.txt")"
summarize "$code" "$protocol" "$profile" "$output/bundle.txt" "$log" > "$output/summary.md" \
  || echo "specval-check: could not write the step summary (see above)" >&2
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  { echo "bundle=$evidence"; echo "exit-code=$code"; } >> "$GITHUB_OUTPUT"
fi
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  cat "$output/summary.md" >> "$GITHUB_STEP_SUMMARY"
fi
if [ -f "$junit" ]; then junit_note="JUnit $junit"; else junit_note="no JUnit file"; fi
echo "specval-check: exit $code; $(grep -c . "$output/bundle.txt") bundle(s) in $output/bundle.txt; ${evidence:+verify: $evidence; }$junit_note"
exit "$code"
