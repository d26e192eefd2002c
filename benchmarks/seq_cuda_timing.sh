# seq_cuda --profile full twice on one GPU (a cold process, then a warm one), each bundle verified.
# Usage: bash benchmarks/seq_cuda_timing.sh LOG_DIR   (from the repository root; needs CUDA)
# Writes LOG_DIR/gpu.txt (device, exit codes), cold.log / warm.log (each run's output and its
# wall time and peak RSS), gpu_tests.log (the engine's GPU tests of the batched paths) and a copy of
# each new bundle with its verify log. The manifest's `timing` holds the collection's seconds.
set -u
OUT=${1:?usage: bash benchmarks/seq_cuda_timing.sh LOG_DIR}
mkdir -p "$OUT"
export PYTHONPATH=.
before=$(ls -d reports/seq_cuda-* 2>/dev/null | tr "\n" " ")
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" >> "$OUT/gpu.txt"
python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/engine/runners/test_collection.py tests/engine/test_api.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/gpu.txt"
for run in cold warm; do
  /usr/bin/time -f "%e s wall, %M KB max RSS" python3 -m specval run protocols/seq_cuda.yaml --profile full \
    --output reports --quiet > "$OUT/$run.log" 2>&1
  echo "$run rc=$?" >> "$OUT/gpu.txt"
done
for bundle in $(ls -d reports/seq_cuda-*); do
  case " $before " in *" $bundle "*) continue ;; esac
  cp -r "$bundle" "$OUT/"
  python3 -m specval verify "$bundle" > "$OUT/verify-$(basename "$bundle").log" 2>&1
  echo "verify $bundle rc=$?" >> "$OUT/gpu.txt"
done
cp reports/ledger.json "$OUT/ledger.json"
cat "$OUT/gpu.txt"
tail -n 3 "$OUT/cold.log" "$OUT/warm.log" "$OUT/gpu_tests.log"
