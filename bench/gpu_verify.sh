#!/usr/bin/env bash
# The GPU verification, for a lent GPU machine (../shared/device.md). Ran on an NVIDIA H200
# on 2026-11-27 (docs/benchmarks-gpu.md, "Results"); rehearsed on the CPU with --dry-run.
#
# THE PLAN: 5 device calls; ~4 minutes of device time on the H200 from a cold start (measured:
# the start 30 s, the copies 4-6 s each, then 72 s and 107 s), budgeted at ~11 (a
# start of ~2 min, 3 copy calls of ~20 s, then 270 s and 240 s), leaving ~3 min for one
# short rerun of what failed. Each call must follow the last within 30 s (an idle machine
# goes back). Here, in the repository's root, first:
#   ../shared/tools/device-wheels onnxruntime-gpu==1.31.1 pyzmq msgspec   (4 parts, .devwheels/p00-p03)
# then, back to back (docs/benchmarks-gpu.md, "Runbook", has the same with timeout_s):
#   1-3. run(carry=[".devwheels/pNN"], command="mkdir -p /tmp/parts && cp .devwheels/pNN/* /tmp/parts/ && ls /tmp/parts")
#   4.   run(carry=[".devwheels/p03"], command="mkdir -p /tmp/parts && cp .devwheels/p03/* /tmp/parts/ && bash bench/gpu_verify.sh first --budget 270")
#   5.   run(command="bash bench/gpu_verify.sh second --budget 240")
# A rerun: run(command="bash bench/gpu_verify.sh second --budget LEFT --steps 'STEP ...'"), LEFT
# being status's budget_left_s less 60 (and at most 570); a fresh machine needs calls 1-4 again.
#
#   bash bench/gpu_verify.sh first|second --budget SECONDS [--steps "A B"] [--out DIR]
#   bash bench/gpu_verify.sh --dry-run [--out DIR] [--steps "A B"] [--budget SECONDS]
#
# first: install (the parts in /tmp/parts, joined, unpacked, pip-installed into /tmp/site);
#   preflight (a few seconds: nvidia-smi, uname -r, versions, the device, a green context's
#   stream, a cuStreamWaitValue32); libs (CUDA runtime, cuBLAS, cuRAND, cuDNN load); provider
#   (a cnn-heavy session really on CUDA, with no node on the CPU); tests (pytest -m gpu);
#   headline (the benchmark's scenarios 1, 7, 2 and 8: realtime alone, bulk alone (does it
#   keep the GPU busy?), realtime beside saturating bulk, bulk alone at twice the rate).
#   Estimated ~30 + 5 + 5 + 15 + 40 + 140 s.
# second: stream (a lane's kernels on its stream: mlp-light plain and with CUDA graphs,
#   cnn-heavy through cuDNN); green, then bench-green (scenario 9) only if it passed; edges;
#   ipc; weights; bench-rest (scenarios 3, 4, 6, 5); memory (the longest) with what is left:
#   the last two may be cut short (what they finished is kept), and are a rerun's first pick.
# The budget is the caller's: the device time the call may use (never more than status's
# budget_left_s less the next calls' share); there is no default. Each step runs under
# `timeout` within what is left of it, less 20 s (the kill's grace, packing). A check or
# benchmark ended by its limit (SIGTERM) writes what it had, and its error, first. A
# step's exit code 3 is UNSUPPORTED (a feature the machine lacks, e.g. CUDA IPC under
# gVisor), not a failure. `second` stops at once where call 4's wheels are not installed.
#
# Results come back in DIR ($OUT, else ./gpu-verify): gpu-verify-CALL.tar.gz, every step's
# log and JSON, repacked every 20 s and after every step (a call killed at its limit
# returns all that was there 20 s before), and gpu-verify-CALL.md, the table of steps, a
# row as each ends: 2 files a call. EDGED_ORT_LOG_LEVEL defaults to 1 here, so the
# daemons' logs (kept) show CUDA graph captures and copied initializers.
#
# --dry-run rehearses the 5 calls on this machine, in order, each with an OUT of its own
# under DIR: stand-in parts of device-wheels' layout (or the real ones, if .devwheels/p*
# holds them) copied and installed into a scratch site, then `first` and `second`, their
# daemons on tests/support/fake_gpu.py's backend registered as onnxruntime-cuda (the CPU
# provider behind it; tests/support/dry_run/sitecustomize.py), so every step runs and
# each check that needs a real GPU fails into its JSON. Nothing it shows is a GPU figure.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
call="" budget="" steps=${GPU_VERIFY_STEPS:-} dir=${OUT:-gpu-verify}
while (($#)); do
  case $1 in
    first | second | --dry-run) call=$1 ;;
    --budget) budget=$2; shift ;;
    --steps) steps=$2; shift ;;
    --out) dir=$2; shift ;;
    *) echo "unknown argument $1: see the top of $0" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $call ]] || { echo "usage: bench/gpu_verify.sh first|second --budget SECONDS [--steps 'A B'] [--out DIR], or --dry-run" >&2; exit 2; }
out=$(mkdir -p "$dir" && cd "$dir" && pwd)
cd "$root"
export py=${PYTHON:-python3}

if [[ $call == --dry-run ]]; then
  exec bash "$root/bench/gpu_dry_run.sh" "$out" "${budget:-}" "$steps"
fi
[[ $budget =~ ^[0-9]+$ ]] || { echo "--budget SECONDS is required: the device time this call may use (status's budget_left_s, less what the next calls need)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-verify-$call.XXXX") # packed into $out, never written there
packer=""
trap '[[ -n $packer ]] && kill "$packer" 2>/dev/null; rm -rf "$work"' EXIT
export site=${GPU_VERIFY_SITE:-/tmp/site} parts=${GPU_VERIFY_PARTS:-/tmp/parts} work
export PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}"
export EDGED_ORT_LOG_LEVEL=${EDGED_ORT_LOG_LEVEL:-1}
started=$SECONDS
summary="$out/gpu-verify-$call.md"
printf '| step | outcome | seconds | last line of its log |\n|---|---|---|---|\n' >"$summary"
failed=0

pack() { # the logs and results so far, as one archive replaced whole (never half written)
  cp "$summary" "$work/" 2>/dev/null
  local part="$out/.gpu-verify-$call.tar.gz.$BASHPID"
  tar -czf "$part" -C "$work" . 2>/dev/null && mv -f "$part" "$out/gpu-verify-$call.tar.gz"
  rm -f "$part"
}
# Its output goes nowhere: killed, it leaves a sleep behind, which would hold the caller's pipes open.
(while sleep "${GPU_VERIFY_PACK_S:-20}"; do pack; done) >/dev/null 2>&1 &
packer=$!

step() { # step NAME LIMIT_S COMMAND...: under timeout, logged to $work/NAME.log, recorded, packed
  local name=$1 limit=$2
  shift 2
  [[ -z $steps || " $steps " == *" $name "* ]] || return 0
  local left=$((budget - (SECONDS - started) - 20)) # 20 s kept: timeout's 5 s of grace, then packing
  ((limit > left)) && limit=$left
  if ((limit < 5)); then
    echo "| $name | SKIPPED | 0 | no time left in the call's budget of $budget s |" >>"$summary"
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
    3) outcome=UNSUPPORTED ;;
    124 | 137) outcome="FAIL(timeout ${limit} s)" ;;
    *) outcome="FAIL($rc)" ;;
  esac
  ((rc == 0 || rc == 3)) || failed=1
  echo "| $name | $outcome | $((SECONDS - begin)) | $(tail -n 1 "$work/$name.log" | tr '|' '/' | cut -c1-100) |" >>"$summary"
  pack
  return $rc
}

install_wheels() { # device-wheels' parts in $parts, joined, unpacked and installed into $site
  if [ -f "$site/.edged-installed" ]; then echo "already installed in $site"; return 0; fi
  local id
  id=$(ls "$parts" 2>/dev/null | sed -n 's/^w\([0-9]*\)\.tar\.xz\.[0-9][0-9]$/\1/p' | sort -n | tail -n 1)
  [[ -n $id ]] || { echo "no wheel parts (wID.tar.xz.NN) in $parts: make the copy calls first"; return 1; }
  rm -rf "$work/wheels" && mkdir -p "$work/wheels"
  cat "$parts/w$id".tar.xz.* | "$py" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1 << 20)' |
    tar -xf - -C "$work/wheels" ||
    { echo "the parts of set $id do not make a whole stream: one is missing (a fresh machine?): start again from p00"; return 1; }
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$work"/wheels/*.whl &&
    rm -rf "$work/wheels" && ls "$site" && echo "set $id" >"$site/.edged-installed"
}

# The machine's CUDA libraries are in its own Python's `nvidia` packages (nvidia/cu13/lib,
# nvidia/cudnn/lib, ...), where onnxruntime-gpu in /tmp/site does not look: on the path.
nvidia_libs=$(timeout 30 "$py" -c "
import pathlib, sys
found = [lib for entry in sys.path if (pathlib.Path(entry or '.') / 'nvidia').is_dir()
         for lib in sorted((pathlib.Path(entry or '.') / 'nvidia').glob('*/lib'))]
print(':'.join(str(lib) for lib in found))" 2>/dev/null)
export LD_LIBRARY_PATH="${nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

bench() { # bench NAME SCENARIOS: the benchmark's JSON and daemon logs under $work/NAME
  # shellcheck disable=SC2086  # GPU_BENCH_ARGS is a list of words
  "$py" bench/gpu_bench.py --out "$work/$1" --duration 5 --repeats 1 --scenarios "$2" ${GPU_BENCH_ARGS:-}
}
check() { "$py" bench/gpu_checks.py "$1" --out "$work"; }

case $call in
  first)
    step install 90 install_wheels
    step preflight 30 check preflight
    step libs 30 "$py" -c "
import os, onnxruntime as ort
from edged.backends.onnxruntime_gpu import load_cuda_libraries, nvidia_folders
print('onnxruntime', ort.__version__, 'from', ort.__file__, 'built for CUDA', getattr(ort, 'cuda_version', '?'))
print('nvidia folders:', [str(f) for f in nvidia_folders()])
load_cuda_libraries(ort)
print('the CUDA runtime, cuBLAS, cuRAND and cuDNN load')"
    step provider 60 "$py" -c "
import onnxruntime as ort
from edged.backends.cuda import cuda_available, device_info
from edged.backends.onnxruntime_gpu import load_cuda_libraries
reason = cuda_available()
if reason: raise SystemExit(reason)
print('device:', device_info(0))
load_cuda_libraries(ort)
options = ort.SessionOptions()
options.add_session_config_entry('session.disable_cpu_ep_fallback', '1')  # no node on the CPU
session = ort.InferenceSession('engines/cnn-heavy/model.onnx', options, providers=['CUDAExecutionProvider'], enable_fallback=0)
# get_available_providers lists CUDA even when it cannot load: the session's own list tells.
print('session providers:', session.get_providers())
if session.get_providers()[0] != 'CUDAExecutionProvider': raise SystemExit('the CUDA provider did not load')
print('cnn-heavy on CUDAExecutionProvider, no node on the CPU')"
    step tests 90 "$py" -m pytest -m gpu -q -rs -p no:cacheprovider tests/backends/test_gpu.py tests/backends/test_tensorrt.py
    step headline 160 bench headline 1,7,2,8
    ;;
  second)
    # A machine handed back after call 4 is a fresh one, without the wheels: say so at once.
    if [ ! -f "$site/.edged-installed" ]; then
      echo "| installed | FAIL | 0 | no wheels in $site: a fresh machine? make calls 1-4 again |" | tee -a "$summary"
      pack
      exit 1
    fi
    step stream 60 check stream
    step green 30 check green && step bench-green 45 bench bench-green 9
    step edges 30 check edges
    step ipc 40 check ipc
    step weights 60 check weights
    step bench-rest 150 bench bench-rest 3,4,6,5
    step memory 150 check memory
    ;;
esac

kill "$packer" 2>/dev/null
packer=""
pack
rm -f "$out"/.gpu-verify-"$call".tar.gz.* # what a packer ended mid-write left
echo
echo "results in $out/gpu-verify-$call.tar.gz ($((SECONDS - started)) s of a budget of $budget s)"
for table in "$work"/*/gpu-bench.md; do [ -f "$table" ] && cat "$table"; done
cat "$summary"
exit $failed
