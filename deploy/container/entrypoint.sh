#!/usr/bin/env bash
# Container entrypoint: engines are tied to the board (TensorRT, GPU, L4T). The engine in the hostPath folder is
# served when it was built from this image's model on this kind of board; else, in order: the set kept in
# previous/ (a `helm rollback` to the image that built it: swapped back, no build), the shared cache of this
# engine identity (EDGE_ENGINE_CACHE), a build here (published to the shared cache when it is a folder).
# EDGE_FETCH_ONLY=1 (the chart's DaemonSet when a gate Job per board type builds): never a build; a miss exits 1.
# `jetson-edge-entrypoint gate` (the chart's gate Job): fetch, else build, latency-check on synthetic frames at the
# configured size and budget, and publish: the DaemonSet's pods of that board type then only fetch.
# A build that failed for this model and these build settings stays failed (no rebuild per restart); another
# precision or setting builds; delete <engine>.failed to retry the same.
#   EDGE_CONFIG        the daemon config (model.path is the engine in build.engines_dir)
#   EDGE_SOURCE_MODEL  the FP32 ONNX shipped in the image
#   EDGE_ENGINE_CACHE  optional: a folder or http(s):// URL shared by nodes of one board type
#   EDGE_SOURCE_URI    optional: source.uri from a Secret (written to a private copy of the config, not argv)
#   EDGE_GATE_FRAMES   the gate's latency check (default 300 frames)
set -euo pipefail
config="${EDGE_CONFIG:?EDGE_CONFIG is not set}"
source_model="${EDGE_SOURCE_MODEL:?EDGE_SOURCE_MODEL is not set}"

# Host socket folders mounted read-only at /host/*: link the sockets where their clients look for them.
if [ -d /host/tmp ]; then ln -sfn /host/tmp/argus_socket /tmp/argus_socket; fi
if [ -d /host/run ]; then ln -sfn /host/run/jtop.sock /run/jtop.sock; fi

if [ -n "${EDGE_SOURCE_URI:-}" ]; then
  private="$(mktemp -d)/config.yaml"
  python3 - "$config" "$private" <<'PY'
import os, sys

import yaml

with open(sys.argv[1]) as fh:
    cfg = yaml.safe_load(fh)
cfg.setdefault("source", {})["uri"] = os.environ["EDGE_SOURCE_URI"]
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
with os.fdopen(fd, "w") as fh:
    yaml.safe_dump(cfg, fh)
PY
  config="$private"
fi

status() {  # prints why the engine is not current; exit 0 when it is
  python3 - "$config" "$source_model" "$1" <<'PY'
import sys

from edge.model.plan import artifact_status
from edge.config import load_config
from edge.errors import EdgeError

try:
    overrides = {"build.engines_dir": sys.argv[3]} if sys.argv[3] else {}
    current, why = artifact_status(load_config(sys.argv[1], overrides), model=sys.argv[2], engine=True)
except EdgeError as exc:  # e.g. no TensorRT: the build below says so in one line
    current, why = False, str(exc)
print(why)
sys.exit(0 if current else 1)
PY
}

engines="$(python3 -c 'import sys; from edge.config import load_config; print(load_config(sys.argv[1]).build.engines_dir)' "$config")"
# what a failed build is keyed by: the model's sha256 and every build setting (precision, calibration, ...)
build_key="$(python3 - "$config" "$source_model" <<'PY'
import dataclasses, hashlib, json, sys

from edge.config import load_config

with open(sys.argv[2], "rb") as fh:
    model = hashlib.sha256(fh.read()).hexdigest()
build = dataclasses.asdict(load_config(sys.argv[1]).build)
print(hashlib.sha256(json.dumps([model, build], sort_keys=True).encode()).hexdigest())
PY
)"
mkdir -p "$engines"
failed="$engines/$(basename "${source_model%.onnx}").failed"

if [ "${1:-}" = gate ]; then
  if [ -z "${EDGE_ENGINE_CACHE:-}" ]; then
    echo "jetson-edge-entrypoint: gate: EDGE_ENGINE_CACHE (a folder) is needed to publish" >&2
    exit 2
  fi
  if edge cache fetch "$EDGE_ENGINE_CACHE" --engine --config "$config" --model "$source_model"; then
    echo "jetson-edge-entrypoint: gate: this engine identity was built and gated before"
    exit 0
  fi
  edge build --engine --config "$config" --model "$source_model" --no-progress
  edge check --config "$config" --source synthetic --frames "${EDGE_GATE_FRAMES:-300}" --warmup 10 --json "" \
    --plot ""
  edge cache publish "$EDGE_ENGINE_CACHE" --engine --config "$config" --model "$source_model"
  exit 0
fi

if reason="$(status "")"; then
  echo "jetson-edge-entrypoint: engine matches this board"
elif status "$engines/previous" > /dev/null; then
  echo "jetson-edge-entrypoint: previous/ holds this model's engine (a rollback): swapping it back"
  edge rollback --engine --config "$config" --model "$source_model"
elif [ -n "${EDGE_ENGINE_CACHE:-}" ] && edge cache fetch "$EDGE_ENGINE_CACHE" --engine --config "$config" \
       --model "$source_model"; then
  echo "jetson-edge-entrypoint: engine fetched from the shared cache"
elif [ "${EDGE_FETCH_ONLY:-}" = 1 ]; then
  echo "jetson-edge-entrypoint: fetch only, and no engine for this board type in ${EDGE_ENGINE_CACHE:-(no cache)}" \
    "(its gate Job publishes it): $reason" >&2
  exit 1
elif [ -f "$failed" ] && [ "$(cat "$failed")" = "$build_key" ]; then
  echo "jetson-edge-entrypoint: the build of this model with these build settings failed before ($failed);" \
    "delete it to retry" >&2
  exit 1
else
  echo "jetson-edge-entrypoint: building the engine: $reason"
  if ! edge build --engine --config "$config" --model "$source_model" --no-progress; then
    echo "$build_key" > "$failed"
    exit 1
  fi
  if [ -f "$failed" ] && [ "$(cat "$failed")" = "$build_key" ]; then rm -f "$failed"; fi
  case "${EDGE_ENGINE_CACHE:-}" in
    "" | http://* | https://*) ;;
    *) edge cache publish "$EDGE_ENGINE_CACHE" --engine --config "$config" --model "$source_model" ;;
  esac
fi
exec edge run --config "$config"
