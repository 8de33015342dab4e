#!/usr/bin/env bash
# GPU verification in one command, for a CUDA machine whose Python already has torch
# (no uv, no network): the workspace's sources go on PYTHONPATH, wheels in .whl/ (torchao, ...)
# are installed into a scratch folder first. Each step logs to $OUT (default ./gpu-out).
#
#   bash tools/gpu/run.sh [env] [tests] [fp8] [step] [offload]   (no argument: all)
#
# The gpu-marked tests include NCCL in one process (process group, collectives, a checkpoint
# round-trip); the benchmarks print the tables that tools/bench/README.md records.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
site=/tmp/accel-gpu-site
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl || exit 1
fi
PYTHONPATH=$(printf '%s:' "$PWD"/packages/*/src)"$site"
export PYTHONPATH
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(env tests fp8 step offload)
status=0
for step in "${steps[@]}"; do
  echo "=================== $step"
  case $step in
    env)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
      $PY - <<'PY'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(),
      "capability", torch.cuda.get_device_capability(), "nccl", torch.cuda.nccl.version())
for name in ("torchao", "transformer_engine", "deepspeed", "accelerate", "safetensors", "yaml", "psutil"):
    try:
        m = importlib.import_module(name)
        print(f"{name:20s} {getattr(m, '__version__', '?')}")
    except Exception as err:
        print(f"{name:20s} missing ({type(err).__name__}: {err})")
PY
      ;;
    tests)
      $PY -m pytest -m gpu -q -p no:cacheprovider -o addopts="--import-mode=importlib -ra" \
        --continue-on-collection-errors packages integration-tests 2>&1 | tee "$OUT/pytest-gpu.log" \
        || status=1 ;;
    fp8)
      $PY tools/bench/bench_fp8.py --verbose 2>&1 | tee "$OUT/bench_fp8.log" || status=1 ;;
    step)
      $PY tools/bench/bench_gpu_step.py 2>&1 | tee "$OUT/bench_gpu_step.log" || status=1 ;;
    offload)
      $PY tools/bench/bench_offload.py 2>&1 | tee "$OUT/bench_offload.log" || status=1 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
exit $status
