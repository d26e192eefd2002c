#!/usr/bin/env bash
# The README's test command: set up, then run the whole suite on the CPU.
# Triton kernels run under the interpreter here; GPU-only tests skip with a reason.
# Without arguments it then runs the numerics-sensitive folders again with torch's portable CPU
# kernels (ATEN_CPU_CAPABILITY=default), the summation orders and exp of a CPU without AVX, so
# a test that only passes bit-exactly on this machine's kernels fails here too. With arguments
# (a path, -k ...) only the first run is made, with those arguments.
# Exit status: non-zero if either run fails (set -e stops at the first failing run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --real
export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"
NUMERICS_FOLDERS=(tests/engine/sampling tests/engine/models)
.venv/bin/python -m pytest -q "$@"
if [ "$#" -eq 0 ]; then
  echo "== ${NUMERICS_FOLDERS[*]} again with ATEN_CPU_CAPABILITY=default (portable CPU kernels)"
  ATEN_CPU_CAPABILITY=default .venv/bin/python -m pytest -q "${NUMERICS_FOLDERS[@]}"
fi
