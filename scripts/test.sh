#!/usr/bin/env bash
# The README's test command: set up, then run the whole suite on the CPU.
# Triton kernels run under the interpreter here; GPU-only tests skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --real
export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"
exec .venv/bin/python -m pytest -q "$@"
