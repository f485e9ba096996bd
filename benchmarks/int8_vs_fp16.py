"""INT8 vs FP16 engines side by side on this device: the same 1280x720 frames through CudaPreprocessor and the
TensorRT backend, wall-clock p50/p99 and device p50 per engine, and their ratio. Reported, never asserted (it was a
device test that asserted nothing): a fully INT8 MobileNetV3 may be no faster than FP16 (NVIDIA/TensorRT#2197), so
choose INT8 for speed only where this says so.

    .venv/bin/python benchmarks/int8_vs_fp16.py --fp16 engines/m.fp16.engine --int8 engines/m.int8.engine

Needs TensorRT, pycuda and a CUDA device (a Jetson); one line naming what is missing otherwise.
"""

import argparse
import os
import sys
import time
from typing import Dict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from edge.config import PreprocessConfig  # noqa: E402
from edge.infer.select import gpu_unavailable  # noqa: E402

WARMUP = 20


def run_frames(engine: str, frames: int) -> Dict[str, float]:
    from edge.infer.cuda_preprocess import CudaPreprocessor
    from edge.infer.cuda_session import CudaSession
    from edge.infer.tensorrt_backend import TensorRTBackend

    frame = np.random.default_rng(0).integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    session = CudaSession()
    wall, device = [], []
    try:
        runner = TensorRTBackend(engine, session)
        pre = CudaPreprocessor(PreprocessConfig(), session)
        with runner as backend:
            pre.write_as(backend.input_dtype)
            for i in range(frames + WARMUP):
                t0 = time.perf_counter()
                backend.infer(pre(frame))
                if i >= WARMUP:
                    wall.append((time.perf_counter() - t0) * 1e3)
                    device.append(sum(backend.device_ms().values()))
            pre.close()
    finally:
        session.release()
    return {"p50_ms": float(np.percentile(wall, 50)), "p99_ms": float(np.percentile(wall, 99)),
            "device_p50_ms": float(np.percentile(device, 50))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fp16", required=True, help="an FP16 engine (edge build --engine with build.precision fp16)")
    p.add_argument("--int8", required=True, help="an INT8 engine of the same model")
    p.add_argument("--frames", type=int, default=300)
    args = p.parse_args()
    missing = gpu_unavailable()
    if missing:
        print("int8_vs_fp16: needs TensorRT, pycuda and a CUDA device: " + missing, file=sys.stderr)
        return 2
    fp16, int8 = run_frames(args.fp16, args.frames), run_frames(args.int8, args.frames)
    for name, result in (("fp16", fp16), ("int8", int8)):
        print("{:<5} p50 {p50_ms:7.3f} ms  p99 {p99_ms:7.3f} ms  device p50 {device_p50_ms:7.3f} ms".format(
            name, **result))
    print("INT8/FP16 device time ratio: {:.2f}".format(int8["device_p50_ms"] / fp16["device_p50_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
