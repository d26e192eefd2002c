#!/usr/bin/env bash
# specval in a team's CI: install specval (the harness alone: no torch, no triton), run the smoke (or
# ci) profile of the team's frozen protocol, keep the bundle and the JUnit file for upload, and exit
# with specval's exit code, so the job fails on anything but PASS. Called by specval.yml (GitHub
# Actions); any CI can call it the same way.
#
# Environment (only SPECVAL_PROTOCOL is required):
#   SPECVAL_PROTOCOL      the protocol file (frozen in the frozen.lock beside it)
#   SPECVAL_PROFILE       its profile (default: smoke)
#   SPECVAL_OUTPUT        folder of the bundle, the seed ledger, junit.xml and bundle.txt
#                         (default: specval-results); upload it as the job's artifact
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
# Exit status: specval's (0 PASS; 1 FAIL; 2 input error, nothing claimed; 3 the adapter raised, the
# bundle is kept; 4 INCONCLUSIVE and 5 environment error where the installed specval has them;
# 130 interrupted); 2 when SPECVAL_PROTOCOL or SPECVAL_PACKAGE is missing, 5 when pip fails.
set -uo pipefail

python="${SPECVAL_PYTHON:-python3}"
protocol="${SPECVAL_PROTOCOL:-}"
profile="${SPECVAL_PROFILE:-smoke}"
output="${SPECVAL_OUTPUT:-specval-results}"

if [ -z "$protocol" ]; then
  echo "specval-check: SPECVAL_PROTOCOL is not set (the protocol file to run)" >&2
  exit 2
fi
if [ "${SPECVAL_SKIP_INSTALL:-0}" != 1 ]; then
  if [ -z "${SPECVAL_PACKAGE:-}" ]; then
    echo "specval-check: SPECVAL_PACKAGE is not set (what pip installs), nor SPECVAL_SKIP_INSTALL=1" >&2
    exit 2
  fi
  if [ -n "${SPECVAL_TORCH:-}" ]; then
    "$python" -m pip install -q "torch==${SPECVAL_TORCH}" || exit 5
  fi
  "$python" -m pip install -q "$SPECVAL_PACKAGE" || exit 5
fi

mkdir -p "$output"
# shellcheck disable=SC2086  # SPECVAL_ARGS is a list of arguments
"$python" -m specval run "$protocol" --profile "$profile" --output "$output" --junit "$output/junit.xml" --quiet \
  ${SPECVAL_ARGS:-} 2>&1 | tee "$output/specval.log"
code="${PIPESTATUS[0]}"

bundle="$(sed -n 's/^bundle: \([^ ]*\).*/\1/p' "$output/specval.log" | tail -n 1)"
echo "$bundle" > "$output/bundle.txt"
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  { echo "bundle=$bundle"; echo "exit-code=$code"; } >> "$GITHUB_OUTPUT"
fi
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  { echo "### specval: $protocol ($profile), exit $code"; echo; echo '```'; tail -n 3 "$output/specval.log"; echo '```'; } \
    >> "$GITHUB_STEP_SUMMARY"
fi
echo "specval-check: exit $code; bundle ${bundle:-none}; JUnit $output/junit.xml"
exit "$code"
