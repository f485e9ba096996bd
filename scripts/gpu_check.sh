#!/usr/bin/env bash
# The GPU check (docs/gpu.md): everything that needs a real CUDA GPU, as one prepared command.
#
#   scripts/gpu_check.sh prepare [KIT]      here: pycuda for the GPU machine's Python 3.12 (../shared/tools/
#                                           pycuda_kit.sh) and a MobileNetV3-Small ONNX into KIT (default .gpu_kit,
#                                           ignored by git); prints the command to run there and what to carry
#   scripts/gpu_check.sh run OUTDIR [--dry-run]
#                                           there, in the checkout: nvidia-smi, the kernel built into a temporary
#                                           kernel dir, `edge doctor`, the device suite's CUDA tier (and TensorRT
#                                           tier where tensorrt imports), the README suite's GPU-sensitive tests,
#                                           benchmarks/gpu_preprocess.py, `edge run --preprocess cuda --frames 300`
#                                           beside ONNX Runtime. Writes OUTDIR/gpu_check.json (one record) and
#                                           OUTDIR/gpu_check.log; exits 0 only if every step passed, 1 if one
#                                           failed, 3 with one line naming what is missing where there is no GPU.
#
# There: $GPU_CHECK_PYTHON (default python3, the machine's own) with $GPU_KIT/site (default .gpu_kit/site: the
# carried pycuda) on PYTHONPATH; on a Jetson or a workstation with pip's pycuda installed, no kit is needed.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 2
die() { echo "gpu_check: $*" >&2; exit 2; }

prepare() {
  local kit=${1:-.gpu_kit} tool py
  mkdir -p "$kit" && kit=$(cd "$kit" && pwd) || die "cannot make $1"
  case "$kit/" in "$repo"/*) ;; *) die "$kit: the kit must lie inside the checkout (only the checkout travels)";; esac
  git check-ignore -q "$kit" || die "$kit: not ignored by git (.gitignore has .gpu_kit/): it would travel as a change"
  tool=${PYCUDA_KIT:-}
  for candidate in "$repo/../shared/tools/pycuda_kit.sh" "$repo/../../shared/tools/pycuda_kit.sh"; do
    [ -n "$tool" ] || { [ -x "$candidate" ] && tool=$candidate; }
  done
  [ -n "$tool" ] || die "no pycuda_kit.sh beside the checkout (../shared/tools/): set PYCUDA_KIT=PATH"
  local py312=${PYTHON312:-}  # the GPU machine's Python is 3.12: pyenv's, or one on PATH that runs
  for candidate in "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.12*/bin/python3.12 python3.12; do
    [ -n "$py312" ] || { "$candidate" -c '' 2>/dev/null && py312=$candidate; }
  done
  [ -n "$py312" ] || die "no Python 3.12 here (the GPU machine's version) to build pycuda with: set PYTHON312=PATH"
  "$tool" "$kit" "$(command -v "$py312")" || die "pycuda_kit.sh failed (its message is above)"
  py=$repo/.venv/bin/python; [ -x "$py" ] || py=python3
  "$py" -m edge export --arch mobilenet_v3_small --weights random --force \
    --out "$kit/model/mobilenet_v3_small.onnx" >/dev/null || die "edge export of the check's model failed"
  local size rel=${kit#"$repo"/}
  size=$(( $(du -sm "$kit" | cut -f1) + $(git ls-files -z | xargs -0 du -cm 2>/dev/null | tail -n1 | cut -f1) ))
  [ "$size" -lt 60 ] || die "checkout + $rel is $size MiB: over what a device call carries (64 MiB)"
  echo "gpu_check: $rel ready ($size MiB with the checkout). On the GPU machine, from this checkout's root:"
  echo "  run(command=\"scripts/gpu_check.sh run \$OUT\", carry=[\"$rel\"], timeout_s=540)"
}

# --- run: one step = one command, its output in the log, its outcome in the record ---------------------------------
step() {  # step NAME TIMEOUT_S COMMAND...: runs it (unless dry), appends "name<TAB>status<TAB>seconds<TAB>detail"
  local name=$1 limit=$2 start rc detail status
  shift 2
  echo "=== $name: $*" >>"$log"
  if [ -n "$dry" ]; then
    printf '%s\tdry run\t0\t%s\n' "$name" "$(echo "$*" | tr '\t\n' '  ')" >>"$steps"; return 0
  fi
  start=$(date +%s%N)
  timeout "$limit" "$@" >"$work/$name.out" 2>&1; rc=$?
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  cat "$work/$name.out" >>"$log"
  detail=$(grep -v '^\s*$' "$work/$name.out" | tail -n1 | tr '\t' ' ' | cut -c1-300)
  case $rc in 0) status=passed;; 124) status="failed (over ${limit} s)";; *) status="failed (exit $rc)";; esac
  printf '%s\t%s\t%d.%d\t%s\n' "$name" "$status" $((ms / 1000)) $((ms % 1000 / 100)) "$detail" >>"$steps"
  [ $rc -eq 0 ] || failed=1
}

doctor_lines() {  # the doctor sees this GPU and loads the kernel built here
  "$py" -m edge doctor --source synthetic --model "$model" | tee "$work/doctor.txt" \
    && grep -Eq '^ok +gpu ' "$work/doctor.txt" && grep -Eq '^ok +kernel +loads from ' "$work/doctor.txt"
}

edge_run() {  # --preprocess cuda beside ONNX Runtime: the start line says cuda, the report counts 300 frames
  "$py" -m edge run --model "$model" --backend onnxruntime --preprocess cuda --frames 300 --source synthetic \
    >"$work/run.jsonl" && cat "$work/run.jsonl" && "$py" - "$work/run.jsonl" <<'EOF'
import json, sys
events = {e.get("event"): e for e in (json.loads(l) for l in open(sys.argv[1], encoding="utf-8") if l.startswith("{"))}
start, report = events["start"], events["report"]
assert start["preprocess"] == "cuda", start["preprocess"]
assert report["frames"] == 300 and report["errors"] == 0, report
print("edge run: preprocess cuda, 300 frames, end-to-end p50 {} ms".format(report["stages_ms"]["end_to_end"]["p50"]))
EOF
}

missing() {  # one line naming what stops the check here, or nothing
  "$py" -c 'import sys' 2>/dev/null || { echo "no $py"; return; }
  "$py" - <<'EOF' 2>/dev/null || echo "$py cannot import edge from $repo"
from edge.infer.select import cuda_unavailable
problem = cuda_unavailable()
if problem is not None:
    hint = " (prepare carries pycuda: scripts/gpu_check.sh prepare, carry .gpu_kit)" if "pycuda" in problem else ""
    print(problem + hint)
EOF
}

record() {  # the one JSON record, from the steps' lines and what the steps wrote
  "$py" - "$steps" "$out/gpu_check.json" "$1" "$2" "$work" <<'EOF'
import json, os, platform, socket, subprocess, sys, time
steps_file, target, status, missing, work = sys.argv[1:]

def read_json(name, last_event=None):
    try:
        with open(os.path.join(work, name), encoding="utf-8") as fh:
            if last_event is None:
                return json.load(fh)
            return [e for e in map(json.loads, (l for l in fh if l.startswith("{"))) if e.get("event") == last_event][-1]
    except (OSError, ValueError, IndexError):
        return None

steps = []
with open(steps_file, encoding="utf-8") as fh:
    for line in fh:
        name, outcome, seconds, detail = (line.rstrip("\n").split("\t", 3) + [""] * 4)[:4]
        steps.append({"name": name, "status": outcome, "seconds": float(seconds or 0), "detail": detail})
git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, encoding="utf-8", errors="replace")
smi = os.path.join(work, "nvidia_smi.out")
record = {"check": "gpu_check", "status": status, "missing": missing or None,
          "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
          "commit": git.stdout.strip() or None, "python": platform.python_version(),
          "gpu": open(smi, encoding="utf-8", errors="replace").readline().strip() if os.path.isfile(smi) else None,
          "steps": steps, "benchmark": read_json("bench.json"), "edge_run": read_json("run.jsonl", "report"),
          "log": "gpu_check.log"}
with open(target + ".part", "w", encoding="utf-8") as out:
    json.dump(record, out, indent=1)
os.replace(target + ".part", target)
EOF
}

run() {
  out=${1:-}; dry=${2:-}
  [ -n "$out" ] || die "usage: scripts/gpu_check.sh run OUTDIR [--dry-run]"
  [ -z "$dry" ] || [ "$dry" = --dry-run ] || die "unknown option $dry (usage: run OUTDIR [--dry-run])"
  mkdir -p "$out" || die "cannot make $out"
  export py=${GPU_CHECK_PYTHON:-python3}
  kit=${GPU_KIT:-$repo/.gpu_kit}
  export PYTHONPATH="$repo${kit:+:$kit/site}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  export work; work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
  export EDGE_KERNEL_DIR=$work/kernels
  log=$out/gpu_check.log; steps=$work/steps.tsv; failed=0
  : >"$log"; : >"$steps"
  export model=$kit/model/mobilenet_v3_small.onnx EDGE_TEST_ONNX=$kit/model/mobilenet_v3_small.onnx
  local why=""
  [ -n "$dry" ] || why=$(missing)
  if [ -n "$why" ]; then
    echo "gpu_check: no GPU to check: $why" | tee -a "$log" >&2
    record "no gpu" "$why" 2>>"$log"
    exit 3
  fi
  [ -n "$dry" ] || [ -f "$model" ] || die "no $model: run scripts/gpu_check.sh prepare here first, carry its kit"
  step nvidia_smi 30 "$0" _nvidia_smi
  step kernel_build 180 "$py" scripts/build_kernel.py --into "$EDGE_KERNEL_DIR"
  step doctor 120 "$0" _doctor
  step device_cuda_tier 300 "$py" -m pytest -p no:cacheprovider -q -rs tests/device -m "jetson and not tensorrt"
  if [ -n "$dry" ] || "$py" -c 'from edge.board import tensorrt_probe; assert tensorrt_probe().problem is None' \
      2>/dev/null; then
    step device_tensorrt_tier 420 "$py" -m pytest -p no:cacheprovider -q -rs tests/device \
      -m "jetson and tensorrt"
  else
    printf 'device_tensorrt_tier\tskipped\t0\tno TensorRT runtime here\n' >>"$steps"
  fi
  step suite_with_a_gpu 300 "$py" -m pytest -p no:cacheprovider -q -n 4 tests/test_doctor.py tests/test_kernel_aot.py \
    tests/test_gpu_check.py \
    tests/device/test_selection.py tests/device/test_simulated.py tests/device/test_cuda_preprocess.py \
    tests/device/test_tensorrt_backend.py tests/device/test_cuda_session.py
  step benchmark 240 "$py" benchmarks/gpu_preprocess.py --frames 300 --json "$work/bench.json"
  step edge_run 180 "$0" _edge_run
  local status=passed
  [ -z "$dry" ] || status="dry run"
  [ $failed -eq 0 ] || status=failed
  record "$status" "" 2>>"$log" || { echo "gpu_check: could not write $out/gpu_check.json (see the log)" >&2; exit 1; }
  echo "gpu_check: $status ($(awk -F'\t' '{printf "%s%s %s", s, $1, $2; s=", "}' "$steps")) -> $out/gpu_check.json"
  [ $failed -eq 0 ]
}

case ${1:-} in
  prepare) shift; prepare "$@";;
  run) shift; run "$@";;
  _nvidia_smi) nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader && nvidia-smi;;
  _doctor) doctor_lines;;  # steps of run, in their own process (under timeout)
  _edge_run) edge_run;;
  *) die "usage: scripts/gpu_check.sh prepare [KIT] | run OUTDIR [--dry-run]";;
esac
