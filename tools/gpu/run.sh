#!/usr/bin/env bash
# GPU verification in one command, for a CUDA machine whose Python already has torch
# (no uv, no network): the workspace's sources go on PYTHONPATH, wheels in .whl/ (torchao, ...)
# are installed into a scratch folder first. Each step logs to $OUT (default ./gpu-out).
#
#   bash tools/gpu/run.sh [STEP ...]   (no argument: every step below, in this order)
#
# Steps, most valuable first (each a pytest run of gpu-marked tests unless said otherwise):
#   env               the GPU, torch, CUDA, NCCL and the optional libraries' versions
#   device            accel_state's cuda device entry answers as torch.cuda does
#   nccl              NCCL in one process: collectives, an FSDP2 checkpoint (accel)
#   hang-nccl         the hang doctor's report holds NCCL's Flight Recorder dump
#   preflight-nccl    NCCL binds the interface the preflight's rule picks
#   reader            the streaming checkpoint reader's pinned staging onto CUDA
#   memory            the training-memory estimate against torch.cuda.max_memory_allocated
#   step-metrics      FLOPs, step time, MFU and allocator peaks of a bf16 step
#   quantized         bitsandbytes and torchao loading onto CUDA against their own quantize
#   fp8               torchao fp8 (tensorwise, rowwise) at widths 4096 and 8192 against bf16
#   replica-nccl      a torchft replica group over ProcessGroupNCCL against plain SGD
#   pipeline          pp=2 schedules over NCCL (needs 2 GPUs, else skipped)
#   deepspeed-reshard ZeRO-2/3 saved on 2 GPUs resumed on 1 (needs 2 GPUs, else skipped)
#   tests             every other gpu-marked test of every package (all of them when the
#                     checks above did not run in this call)
#   fp8-bench step offload   the benchmarks' tables (tools/bench/README.md); `fp8` named on
#                     the command line runs fp8-bench after it, as the step did before
#
# Every step writes one line to $OUT/results.tsv as it ends: name, result (passed, failed,
# failed: timed out after Ns, skipped: REASON, or skipped: no CUDA), seconds. Each step has
# its own timeout, cut further so that the whole run ends within $GPU_BUDGET seconds
# (default 570: inside 10 minutes, with the installs and the start); a step left no time is
# "skipped: no time left". Exit status: 0 when no step failed, 1 otherwise, 2 for an unknown
# step.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-out}
BUDGET=${GPU_BUDGET:-570}
mkdir -p "$OUT"
RESULTS="$OUT/results.tsv"
: >"$RESULTS"
export PYTHONUNBUFFERED=1
site=/tmp/accel-gpu-site
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl || exit 1
fi
PYTHONPATH=$(printf '%s:' "$PWD"/packages/*/src)"$site"
export PYTHONPATH

# -- the checks: step name, its own timeout (seconds), the pytest node ids it runs --------------
A=packages/accel/tests
declare -A LIMIT NODES
LIMIT[device]=40
NODES[device]="packages/accel-state/tests/test_gpu.py::test_the_cuda_entry_answers_as_torch_cuda_does
packages/accel-state/tests/test_gpu.py::test_the_cuda_entry_synchronizes_and_counts_the_caching_allocator
packages/accel-state/tests/test_gpu.py::test_the_cuda_entry_seeds_and_restores_the_generators"
LIMIT[nccl]=60
NODES[nccl]="$A/test_gpu.py::test_nccl_process_group_in_one_process_runs_the_collectives
$A/test_gpu.py::test_fsdp2_with_bf16_and_nccl_trains_and_round_trips_a_sharded_checkpoint"
LIMIT[hang-nccl]=45
NODES[hang-nccl]="packages/accel-state/tests/test_gpu.py::test_the_hang_report_holds_nccls_flight_recorder_dump"
LIMIT[preflight-nccl]=40
NODES[preflight-nccl]="packages/accel-cli/tests/test_gpu.py"
LIMIT[reader]=30
NODES[reader]="packages/accel-bigmodel/tests/test_reader.py::test_cuda_target_streams_through_pinned_staging"
LIMIT[memory]=60
NODES[memory]="packages/accel-parallel/tests/test_gpu.py"
LIMIT[step-metrics]=45
NODES[step-metrics]="$A/test_step_metrics.py::test_bf16_mlp_step_metrics_on_a_gpu_count_the_flops_and_wait_for_the_kernels
$A/test_step_metrics.py::test_bf16_llama_mfu_on_a_gpu_against_the_table_and_by_hand"
LIMIT[quantized]=50
NODES[quantized]="packages/accel-bigmodel/tests/test_quantization.py::test_cuda_load_equals_bitsandbytes_own_on_cuda_and_stays_within_the_step_bound
packages/accel-bigmodel/tests/test_quantization_torchao.py::test_torchao_load_on_cuda_equals_its_own_quantize_on_cuda"
LIMIT[fp8]=60
NODES[fp8]="packages/accel-precision/tests/test_gpu.py::test_fp8_torchao_recipes_at_width_agree_with_bf16"
LIMIT[replica-nccl]=40
NODES[replica-nccl]="$A/test_replica_groups.py::test_a_replica_group_on_cuda_runs_its_collectives_over_nccl"
LIMIT[pipeline]=60
NODES[pipeline]="$A/test_pipeline.py::test_pp2_schedules_on_two_gpus_equal_one_process"
LIMIT[deepspeed-reshard]=90
NODES[deepspeed-reshard]="$A/test_deepspeed.py::test_zero_checkpoints_of_two_gpus_resume_on_one"
LIMIT[tests]=240
LIMIT[env]=30
LIMIT[fp8-bench]=120
LIMIT[step]=60
LIMIT[offload]=60
CHECKS=(device nccl hang-nccl preflight-nccl reader memory step-metrics quantized fp8
  replica-nccl pipeline deepspeed-reshard)
PYTEST=($PY -m pytest -q -p no:cacheprovider -o "addopts=--import-mode=importlib -ra")

START=$SECONDS
status=0
ran=() # node ids the checks of this call ran: `tests` leaves them out

record() { # name result seconds
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$RESULTS"
  echo "------------------- $1: $2 (${3}s)"
}

# What a pytest run's JUnit file says: passed (some passed, none failed), failed (with the
# counts), or skipped: the first reason (every test skipped).
verdict() { # junit-file exit-code
  $PY - "$1" "$2" <<'PY'
import sys
import xml.etree.ElementTree as ET

path, rc = sys.argv[1], int(sys.argv[2])
try:
    cases = list(ET.parse(path).getroot().iter("testcase"))
except (OSError, ET.ParseError):
    cases = []
failed = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
skipped = [c for c in cases if c.find("skipped") is not None]
passed = len(cases) - len(failed) - len(skipped)
if failed or rc not in (0, 5):
    print(f"failed ({len(failed)} failed, {passed} passed, {len(skipped)} skipped, exit {rc})")
elif passed:
    print("passed")
elif skipped:
    reason = skipped[0].find("skipped").get("message", "").replace("\t", " ")
    print(f"skipped: {reason}".rstrip(": ") or "skipped")
else:
    print("failed (no test ran)")
PY
}

# Run `cmd...` under the step's timeout (cut to the time left); record its result.
timed() { # name kind(pytest|plain) cmd...
  local name=$1 kind=$2
  shift 2
  local left=$((BUDGET - (SECONDS - START)))
  local limit=${LIMIT[$name]}
  ((limit > left)) && limit=$left
  if ((limit < 10)); then
    record "$name" "skipped: no time left" 0
    return
  fi
  local t0=$SECONDS rc result
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  if ((rc == 124 || rc == 137)); then
    result="failed: timed out after ${limit}s"
  elif [ "$kind" = pytest ]; then
    result=$(verdict "$OUT/$name.xml" "$rc")
  elif ((rc == 0)); then
    result=passed
  else
    result="failed (exit $rc)"
  fi
  [[ $result == failed* ]] && status=1
  record "$name" "$result" $((SECONDS - t0))
}

check() { # name
  local name=$1 nodes
  mapfile -t nodes <<<"${NODES[$name]}"
  ran+=("${nodes[@]}")
  timed "$name" pytest "${PYTEST[@]}" --junitxml="$OUT/$name.xml" "${nodes[@]}"
}

all_tests() {
  local deselect=() node
  for node in "${ran[@]}"; do deselect+=(--deselect "$node"); done
  timed tests pytest "${PYTEST[@]}" -m gpu --continue-on-collection-errors \
    --junitxml="$OUT/tests.xml" "${deselect[@]}" packages integration-tests
}

env_report() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  $PY - <<'PY'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(),
      "capability", torch.cuda.get_device_capability(), "nccl", torch.cuda.nccl.version(),
      "devices", torch.cuda.device_count())
for name in ("torchao", "transformer_engine", "deepspeed", "torchft", "bitsandbytes",
             "transformers", "accelerate", "safetensors", "yaml", "psutil"):
    try:
        m = importlib.import_module(name)
        print(f"{name:20s} {getattr(m, '__version__', '?')}")
    except Exception as err:
        print(f"{name:20s} missing ({type(err).__name__}: {err})")
PY
}

steps=()
for step in "$@"; do # `fp8` named alone brings its benchmark (the step's name before the checks)
  steps+=("$step")
  [ "$step" = fp8 ] && [[ " $* " != *" fp8-bench "* ]] && steps+=(fp8-bench)
done
[ ${#steps[@]} -eq 0 ] && steps=(env "${CHECKS[@]}" tests fp8-bench step offload)
for step in "${steps[@]}"; do
  case $step in
    env | tests | fp8-bench | step | offload) ;;
    *) [ -n "${NODES[$step]:-}" ] || { echo "unknown step $step"; exit 2; } ;;
  esac
done
cuda=1
$PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || cuda=0
((cuda)) || echo "no CUDA GPU is visible to $PY: every step is skipped"
for step in "${steps[@]}"; do
  echo "=================== $step"
  if ((!cuda)); then
    record "$step" "skipped: no CUDA" 0
    continue
  fi
  case $step in
    env) timed env plain env_report ;;
    tests) all_tests ;;
    fp8-bench)
      timed fp8-bench plain $PY tools/bench/bench_fp8.py --verbose --width 8192 --layers 4 \
        --tokens 8192 --steps 10 --warmup 3 --agree-steps 20 ;;
    step) timed step plain $PY tools/bench/bench_gpu_step.py ;;
    offload) timed offload plain $PY tools/bench/bench_offload.py ;;
    *) check "$step" ;;
  esac
done
echo "=================== results ($RESULTS)"
column -t -s $'\t' "$RESULTS" 2>/dev/null || cat "$RESULTS"
exit $status
