#!/usr/bin/env bash
# The GPU verification, for a lent GPU machine (../shared/device.md): one short sequence of
# device calls. NOT RUN YET: written on machines with no GPU.
#
# Here, in the repository's root, first (downloads the wheels the machine lacks and splits
# them into parts; onnxruntime-gpu is ~256 MB, 5 parts, and pyzmq and msgspec one each):
#   ../shared/tools/device-wheels onnxruntime-gpu==1.31.1 pyzmq msgspec
# Then these device calls, in order, back to back (a machine idle for 30 s is handed back):
#   for each part .devwheels/pNN but the last:
#     run(carry=[".devwheels/pNN"], command="mkdir -p /tmp/parts && cp .devwheels/pNN/* /tmp/parts/")
#   the last part, then call 1:
#     run(carry=[".devwheels/pLAST"], command="mkdir -p /tmp/parts && cp .devwheels/pLAST/* /tmp/parts/ && bench/gpu_verify.sh 1")
#   run(command="bench/gpu_verify.sh 2")
#   run(command="bench/gpu_verify.sh 3")
#   run(command="bench/gpu_verify.sh 4")
#
#   bench/gpu_verify.sh CALL [FOLDER]      CALL 1 to 4; FOLDER defaults to $OUT, else ./gpu-verify
#
# 1: install the carried wheels into /tmp/site (once); deps; libs (cuBLAS and cuDNN load,
#    from the machine's own `nvidia` packages); provider (a session really on CUDA); tests
#    (pytest -m gpu); stream, memory and weights (bench/gpu_checks.py: weights, that a
#    model's weights are on the device once, not once per session).
# 2, 3: bench/gpu_bench.py, scenarios 1-4, then 5-8 (--duration 5 --repeats 2).
# 4: bench/gpu_checks.py green, then scenario 9 (bulk in a green context) only if it passed;
#    then ipc (a 25 MB frame in a client's device memory, through CUDA IPC, against frames);
#    then edges (a pipeline's kept output is the runner's own buffer, equal to `run`'s).
# Estimated, not measured: ~7 min for call 1 (weights ~1 min; should the call's budget run
# out first, GPU_VERIFY_STEPS=weights bench/gpu_verify.sh 1 runs it alone), ~4 min each for
# 2-4; with the machine's start and the wheels' calls, ~20-25 min of device time.
#
# Every step runs under `timeout`, within what is left of GPU_VERIFY_BUDGET_S (default 540
# s, under the 600 s a call may run). Its log is written as it runs, and after every step
# the call's logs and results are packed again into FOLDER/gpu-verify-CALL.tar.gz (one
# file; a call cut short still returns what finished), with FOLDER/gpu-verify-CALL.md, the
# table of steps. GPU_VERIFY_STEPS="deps stream" runs only the steps named.
set -uo pipefail
call=${1:?usage: bench/gpu_verify.sh CALL [FOLDER], CALL 1 to 4}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${2:-${OUT:-gpu-verify}}" && cd "${2:-${OUT:-gpu-verify}}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-verify-$call.XXXX")  # packed into $out, never written there
trap 'rm -rf "$work"' EXIT
cd "$root"
export py=${PYTHON:-python3} site=/tmp/site work
export PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}"
started=$SECONDS
budget=${GPU_VERIFY_BUDGET_S:-540}
summary="$out/gpu-verify-$call.md"
printf '| step | outcome | seconds | last line of its log |\n|---|---|---|---|\n' >"$summary"
failed=0

pack() {
  cp "$summary" "$work/"
  tar -czf "$out/gpu-verify-$call.tar.gz.part" -C "$work" . && mv "$out/gpu-verify-$call.tar.gz.part" "$out/gpu-verify-$call.tar.gz"
}

step() {  # step NAME LIMIT_S COMMAND...: run under timeout, log to $work/NAME.log, record, pack
  local name=$1 limit=$2
  shift 2
  [[ -z ${GPU_VERIFY_STEPS:-} || " $GPU_VERIFY_STEPS " == *" $name "* ]] || return 0
  local left=$((budget - (SECONDS - started) - 15))  # 15 s kept for packing
  ((limit > left)) && limit=$left
  if ((limit < 5)); then
    echo "| $name | SKIPPED | 0 | no time left in the call's budget |" >>"$summary"
    failed=1
    return 1
  fi
  echo "== $name (at most ${limit} s): $*" >&2
  # A function of this script runs in a shell of its own, so that timeout can end it.
  declare -F "$1" >/dev/null && set -- bash -c "$(declare -f "$1"); \"\$@\"" _ "$@"
  local begin=$SECONDS rc outcome
  timeout -k 5 "$limit" "$@" >"$work/$name.log" 2>&1
  rc=$?
  tail -n 20 "$work/$name.log" >&2
  case $rc in
    0) outcome=ok ;;
    124 | 137) outcome="FAIL(timeout ${limit} s)" ;;
    *) outcome="FAIL($rc)" ;;
  esac
  ((rc == 0)) || failed=1
  echo "| $name | $outcome | $((SECONDS - begin)) | $(tail -n 1 "$work/$name.log" | tr '|' '/' | cut -c1-100) |" >>"$summary"
  pack
  return $rc
}

install_wheels() {  # the parts carried to /tmp/parts, joined and installed into /tmp/site
  if [ -d "$site/onnxruntime" ]; then echo "already installed in $site"; return 0; fi
  ls /tmp/parts/*.part.* >/dev/null 2>&1 || { echo "no wheel parts in /tmp/parts: make the carry calls first"; return 1; }
  mkdir -p /tmp/wheels
  for wheel in $(ls /tmp/parts | sed 's/\.part\...$//' | sort -u); do
    cat /tmp/parts/"$wheel".part.* >/tmp/wheels/"$wheel"
  done
  "$py" -m pip install -q --no-index --no-deps --target "$site" /tmp/wheels/*.whl && ls "$site"
}

# The machine's cuBLAS and cuDNN are in its own Python's `nvidia` packages (nvidia/cu13/lib,
# nvidia/cudnn/lib), where onnxruntime-gpu in /tmp/site does not look: put them on the path.
nvidia_libs=$(timeout 30 "$py" -c "
import pathlib, sys
found = [lib for entry in sys.path if (pathlib.Path(entry or '.') / 'nvidia').is_dir()
         for lib in sorted((pathlib.Path(entry or '.') / 'nvidia').glob('*/lib'))]
print(':'.join(str(lib) for lib in found))" 2>/dev/null)
export LD_LIBRARY_PATH="${nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

bench() {
  # shellcheck disable=SC2086  # GPU_BENCH_ARGS is a list of words
  "$py" bench/gpu_bench.py --out "$work" --duration 5 --repeats 2 ${GPU_BENCH_ARGS:-} "$@"
}

case $call in
  1)
    step install 120 install_wheels
    step deps 30 "$py" -c "
import importlib.util as u, sys
names = ('numpy', 'zmq', 'msgpack', 'msgspec', 'onnx', 'ml_dtypes', 'pytest', 'hypothesis', 'onnxruntime', 'cuda.bindings')
missing = [m for m in names if u.find_spec(m) is None]
sys.exit(f'missing: {missing}') if missing else print('all importable')"
    step libs 60 "$py" -c "
import os, onnxruntime as ort
from edged.backends.onnxruntime_gpu import load_cuda_libraries, nvidia_folders
print('onnxruntime', ort.__version__, 'from', ort.__file__, 'built for CUDA', getattr(ort, 'cuda_version', '?'))
print('LD_LIBRARY_PATH:', os.environ.get('LD_LIBRARY_PATH'))
print('nvidia folders:', [str(f) for f in nvidia_folders()])
load_cuda_libraries(ort)
print('the CUDA runtime, cuBLAS and cuDNN load')"
    step provider 90 "$py" -c "
import onnxruntime as ort
from edged.backends.cuda import cuda_available, device_info
from edged.backends.onnxruntime_gpu import load_cuda_libraries
reason = cuda_available()
if reason: raise SystemExit(reason)
print('device:', device_info(0))
load_cuda_libraries(ort)
print('available:', ort.get_available_providers())
session = ort.InferenceSession('engines/cnn-heavy/model.onnx', providers=['CUDAExecutionProvider'], enable_fallback=0)
# get_available_providers lists CUDA even when it cannot load: the session's own list tells.
print('session providers:', session.get_providers())
if session.get_providers()[0] != 'CUDAExecutionProvider': raise SystemExit('the CUDA provider did not load')"
    step tests 180 "$py" -m pytest -m gpu -v -rs -p no:cacheprovider tests/backends/test_gpu.py tests/backends/test_tensorrt.py
    step stream 90 "$py" bench/gpu_checks.py stream --out "$work"
    step memory 200 "$py" bench/gpu_checks.py memory --out "$work"
    step weights 90 "$py" bench/gpu_checks.py weights --out "$work"
    ;;
  2) step bench-1-4 540 bench --scenarios 1,2,3,4 ;;
  3) step bench-5-8 540 bench --scenarios 5,6,7,8 ;;
  4)
    step green 120 "$py" bench/gpu_checks.py green --out "$work" &&
      step bench-9 420 bench --scenarios 9
    step ipc 90 "$py" bench/gpu_checks.py ipc --out "$work"
    step edges 60 "$py" bench/gpu_checks.py edges --out "$work"
    ;;
  *) echo "CALL is 1, 2, 3 or 4, not $call" >&2; exit 2 ;;
esac

pack
echo
echo "results in $out/gpu-verify-$call.tar.gz"
[ -f "$work/gpu-bench.md" ] && cat "$work/gpu-bench.md"
cat "$summary"
exit $failed
