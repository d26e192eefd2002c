#!/usr/bin/env bash
# The README's main job: set up, then run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m engine.sampling.demo "$@"
