#!/usr/bin/env bash
# The README's main job: set up, then run the pre-registered t2 protocol (ci profile) against the
# bundled engine. Prints PASS/FAIL and the bundle's path; exit 0 PASS, 1 FAIL, 2 input error.
# Extra arguments go to `specval run` (e.g. --profile full, --output DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
  set -- --profile ci
fi
exec .venv/bin/specval run protocols/t2_fp32.yaml "$@"
