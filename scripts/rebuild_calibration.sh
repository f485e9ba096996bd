#!/bin/sh
# Calibration rebuild on the device: capture -> calibrate -> build -> gate -> latency check -> install -> reload.
#   scripts/rebuild_calibration.sh --config /etc/jetson-edge/config.yaml --engine --systemd [--dry-run]
# Any failing step keeps the old artifact serving and exits non-zero naming the step (docs/rebuild.md).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -x "$here/.venv/bin/edge" ]; then edge="$here/.venv/bin/edge"; else edge=edge; fi
exec "$edge" rebuild "$@"
