#!/usr/bin/env bash
# The one command for a lent GPU machine: does onnxruntime-gpu's CUDA provider really
# load, do the GPU tests pass, does ONNX Runtime compute on each lane's stream, does a
# daemon serve with the card full, what does the GPU benchmark measure. Prints a short
# table last; full results go to the folder given as $1, else $OUT, else ./gpu-verify.
#
#   bench/gpu_verify.sh [FOLDER]          (from the repository root or anywhere)
#
# Steps: deps, provider, tests (pytest -m gpu), stream and memory (bench/gpu_checks.py),
# bench (bench/gpu_bench.py). GPU_VERIFY_STEPS="stream memory" runs only those named.
#
# Time, estimated (none of it measured yet): deps and provider ~15 s, tests ~1 min,
# stream ~20 s, memory ~1.5 min (two daemons), bench ~7.5 min with
# GPU_BENCH_ARGS="--duration 5 --repeats 2" (see its docstring): ~11 min of commands,
# ~16-18 min of device time with the machine's start and onnxruntime-gpu's wheel. One
# device call may run 10 min, so make two, back to back while the machine is warm:
#   GPU_VERIFY_STEPS="deps provider tests stream memory" bench/gpu_verify.sh "$OUT"
#   GPU_VERIFY_STEPS=bench GPU_BENCH_ARGS="--duration 5 --repeats 2" bench/gpu_verify.sh "$OUT"
#
# NOT RUN YET: written on a machine with no GPU; it cannot run there. The first session
# with a GPU runs it and fixes what breaks. On a lent machine (see device.md):
# - onnxruntime-gpu is not there and cannot be downloaded from it: prepare its wheel with
#   `../shared/tools/device-wheels onnxruntime-gpu==1.31.1`, make the run calls it prints,
#   then run this with `export PYTHONPATH=/tmp/site:$PYTHONPATH` in the same command;
#   the machine's own CPU onnxruntime stays in its site folder, behind /tmp/site;
# - edged's other dependencies (pyzmq, msgpack, msgspec, onnx, ml_dtypes, pytest, hypothesis)
#   must be importable too: step 0 names any that are missing (carry them the same way).
# GPU_BENCH_ARGS adds arguments to bench/gpu_bench.py (say "--duration 5 --repeats 2"
# to stay within one call's time limit; "--scenarios 1,2,8,9" runs a subset).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-${OUT:-gpu-verify}}" && cd "${1:-${OUT:-gpu-verify}}" && pwd)
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
declare -a summary

steps=" ${GPU_VERIFY_STEPS:-deps provider tests stream memory bench} "

step() {  # step NAME COMMAND...: run, log to $out/NAME.log, remember the outcome
  local name=$1
  shift
  [[ $steps == *" $name "* ]] || return 0  # not asked for in GPU_VERIFY_STEPS
  echo "== $name: $*" >&2
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log" >&2
  # The log's last line says what passed and what was skipped (a GPU test skipped is not a pass).
  summary+=("$(printf '| %-8s | %-7s | %s |' "$name" "$([ $rc -eq 0 ] && echo ok || echo "FAIL($rc)")" \
    "$(tail -n 1 "$out/$name.log" | cut -c1-90)")")
  return $rc
}

step deps "$py" -c "
import importlib.util as u, sys
missing = [m for m in ('numpy', 'zmq', 'msgpack', 'msgspec', 'onnx', 'ml_dtypes', 'pytest', 'hypothesis', 'onnxruntime')
           if u.find_spec(m) is None]
sys.exit(f'missing: {missing}') if missing else print('all importable')"

step provider "$py" -c "
import onnxruntime as ort
from edged.backends.cuda import cuda_available, device_info
print('onnxruntime', ort.__version__, 'from', ort.__file__)
reason = cuda_available()
if reason: raise SystemExit(reason)
print('device:', device_info(0))
if hasattr(ort, 'preload_dlls'): ort.preload_dlls()
if hasattr(ort, 'print_debug_info'): ort.print_debug_info()
print('available:', ort.get_available_providers())
session = ort.InferenceSession('engines/mlp-light/model.onnx', providers=['CUDAExecutionProvider'])
print('session providers:', session.get_providers())
# get_available_providers lists CUDA even when it cannot load: the session's own list tells.
if session.get_providers()[0] != 'CUDAExecutionProvider': raise SystemExit('the CUDA provider did not load')"

step tests "$py" -m pytest -m gpu -v -rs tests/backends/test_gpu.py tests/backends/test_tensorrt.py
# ONNX Runtime's kernels on the lane's stream: held by a wait on it, then equal to the CPU.
step stream "$py" bench/gpu_checks.py stream --out "$out"
# A daemon with the rest of the card taken: every class, model and batch size still OK.
step memory "$py" bench/gpu_checks.py memory --out "$out"
# shellcheck disable=SC2086  # GPU_BENCH_ARGS is a list of words
step bench "$py" bench/gpu_bench.py --out "$out" ${GPU_BENCH_ARGS:-}

echo
echo "results in $out"
[ -f "$out/gpu-bench.md" ] && cat "$out/gpu-bench.md"
echo "| step     | outcome | last line of $out/STEP.log |"
echo "|---|---|---|"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q FAIL
