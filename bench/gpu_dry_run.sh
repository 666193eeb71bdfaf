#!/usr/bin/env bash
# bench/gpu_verify.sh --dry-run: the 5 device calls of the plan (the top of gpu_verify.sh),
# rehearsed on this machine with no GPU, each with an OUT of its own (DIR/call-N).
#
#   bash bench/gpu_dry_run.sh DIR [BUDGET_S] [STEPS]
#
# Parts: the real ones if .devwheels/p00.. hold them (device-wheels' output) and this
# Python is 3.12 (their wheels are cp312), else
# stand-ins of the same layout (one xz stream of a tar of wheels, wID.tar.xz.NN, cut in
# 4, one per .devwheels-like folder): a wheel of ~1 MB of random bytes, so that the
# joining, unpacking and installing are the real steps. Each copy call copies its part
# into a scratch /tmp/parts; call 4 installs into a scratch /tmp/site, then runs `first`,
# and call 5 `second`, with tests/support/dry_run on PYTHONPATH (a "Fake GPU" whose
# daemons run the CPU provider; see there) and a small bulk model. Each call's budget is
# BUDGET_S, by default the plan's (270 and 240 s). Last, it checks what the device tool
# would bring back: at most 8 files in each OUT, every archive readable, each call within
# its budget (10 s over at most: the copy and the start of its shell).
# GPU_VERIFY_PACK_S sets the repacking interval (default 20).
set -uo pipefail
out=${1:?usage: bench/gpu_dry_run.sh DIR [BUDGET_S] [STEPS]}
budget=${2:-} # default: the plan's own, 270 s for `first` and 240 s for `second`
steps=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpu-dry-run.XXXX")
trap 'rm -rf "$scratch"' EXIT

# The real parts hold cp312 wheels: pip installs them only on a Python 3.12, as the device's.
if ls .devwheels/p03/w*.tar.xz.03 >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  source=.devwheels
  echo "parts: the real ones in .devwheels (device-wheels' output)"
else
  source=$scratch/devwheels
  echo "parts: stand-ins of device-wheels' layout (no .devwheels/p03 here, or a Python other than 3.12)"
  "$py" - "$source" <<'EOF'
import base64, hashlib, io, lzma, os, sys, tarfile, time, zipfile
source = sys.argv[1]
files = {"edged_standin/__init__.py": b"", "edged_standin/blob.bin": os.urandom(1 << 20)}
files["edged_standin-0.0.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: edged-standin\nVersion: 0.0\n"
files["edged_standin-0.0.dist-info/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: dry-run\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
record = "".join(
    f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
    for name, data in files.items()
) + "edged_standin-0.0.dist-info/RECORD,,\n"
files["edged_standin-0.0.dist-info/RECORD"] = record.encode()
wheel = io.BytesIO()
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
    for name, data in files.items():
        archive.writestr(name, data)
packed = io.BytesIO()
with tarfile.open(fileobj=packed, mode="w") as tar:
    info = tarfile.TarInfo("edged_standin-0.0-py3-none-any.whl")
    info.size = len(wheel.getvalue())
    tar.addfile(info, io.BytesIO(wheel.getvalue()))
stream = lzma.compress(packed.getvalue(), preset=0)
set_id, n = int(time.time()), 4
chunk = -(-len(stream) // n)
for i in range(n):
    os.makedirs(f"{source}/p{i:02d}")
    with open(f"{source}/p{i:02d}/w{set_id}.tar.xz.{i:02d}", "wb") as part:
        part.write(stream[i * chunk : (i + 1) * chunk])
EOF
fi

export GPU_VERIFY_PARTS=$scratch/parts GPU_VERIFY_SITE=$scratch/site EDGED_GPU_DRY_RUN=1 EDGED_FAKE_GPU_FREE_MB=8192
export PYTHONPATH="$root/tests/support/dry_run${PYTHONPATH:+:$PYTHONPATH}" PYTHON=$py
export GPU_BENCH_ARGS=${GPU_BENCH_ARGS:---bulk-channels 8 --bulk-depth 1 --bulk-rate 40 --bulk-senders 2 --realtime-rate 50}
mkdir -p "$GPU_VERIFY_PARTS"
failed=0
for i in 0 1 2 3 4; do
  dir="$out/call-$((i + 1))"
  mkdir -p "$dir"
  begin=$SECONDS
  if ((i < 4)); then # the copy calls, the last of which goes straight on to `first`
    part=$(printf '%s/p%02d' "$source" "$i")
    cp "$part"/* "$GPU_VERIFY_PARTS"/ && ls "$GPU_VERIFY_PARTS" >"$dir/copy.log"
  fi
  limit=30 # a copy call
  if ((i == 3)); then
    limit=${budget:-270}
    OUT=$dir bash bench/gpu_verify.sh first --budget "$limit" --steps "$steps"
  elif ((i == 4)); then
    limit=${budget:-240}
    OUT=$dir bash bench/gpu_verify.sh second --budget "$limit" --steps "$steps"
  fi
  rc=$?
  took=$((SECONDS - begin))
  files=$(find "$dir" -type f | wc -l)
  readable=yes
  for archive in "$dir"/*.tar.gz; do [ -e "$archive" ] && { tar -tzf "$archive" >/dev/null || readable=no; }; done
  echo "dry run: call $((i + 1)): exit $rc, ${took} s (budget ${limit} s), $files files back, archives readable: $readable"
  if ((took > limit + 10 || files > 8)) || [[ $readable != yes ]]; then failed=1; fi
done
exit $failed
