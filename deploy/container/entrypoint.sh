#!/usr/bin/env bash
# Container entrypoint: engines are tied to the board (TensorRT, GPU, L4T). If the engine in the hostPath cache
# was not built from this image's model on this kind of board, build it there (`edge build --engine`), then serve.
#   EDGE_CONFIG        the daemon config (model.path is the engine in build.engines_dir, the cache)
#   EDGE_SOURCE_MODEL  the FP32 ONNX shipped in the image
set -euo pipefail
config="${EDGE_CONFIG:?EDGE_CONFIG is not set}"
source_model="${EDGE_SOURCE_MODEL:?EDGE_SOURCE_MODEL is not set}"

if reason="$(python3 - "$config" "$source_model" <<'PY'
import sys

from edge.build.plan import artifact_status
from edge.config import load_config
from edge.errors import EdgeError

try:
    current, why = artifact_status(load_config(sys.argv[1]), model=sys.argv[2], engine=True)
except EdgeError as exc:  # e.g. no TensorRT: the build below says so in one line
    current, why = False, str(exc)
print(why)
sys.exit(0 if current else 1)
PY
)"; then
  echo "jetson-edge-entrypoint: engine matches this board"
else
  echo "jetson-edge-entrypoint: building the engine: $reason"
  edge build --engine --config "$config" --model "$source_model" --no-progress
fi
exec edge run --config "$config"
