"""Whether the build's offline ONNX Runtime sessions (accuracy gate, float-fallback ranking) should let idle
threads spin, on a machine other work keeps busy (a shared build machine or CI runner).

The gate alternates two sessions (FP32 reference, Q/DQ candidate emulated) image by image; with spinning on,
the idle one's threads busy-wait for work that goes to the other. Runs the real `evaluate` on the shipped
regression set, spinning on and off interleaved round by round, with `--load` busy processes competing
(default: one per core), and prints seconds per round and the ratio.

    .venv/bin/python benchmarks/offline_spinning.py [--arch mobilenet_v3_small] [--rounds 3] [--load N]
"""

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time

from edge.build.calibration import load_calibration_set
from edge.build.export import export_model
from edge.build.gate import evaluate
from edge.build.plan import _Inference
from edge.build.quantize import quantize_qdq
from edge.config import GateConfig, PreprocessConfig
from edge.frame.onnxruntime_backend import OnnxRuntimeBackend

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def busy() -> None:
    while True:
        pass


def gate_seconds(fp32: str, qdq: str, regression, preprocess, spinning: bool) -> float:
    started = time.monotonic()
    with _Inference(OnnxRuntimeBackend(fp32, spinning=spinning)) as reference, \
            _Inference(OnnxRuntimeBackend(qdq, spinning=spinning, emulate_int8=True)) as candidate:
        evaluate(reference, candidate, regression, preprocess, GateConfig())
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="mobilenet_v3_small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy processes competing")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="edge-spin-")
    fp32, qdq = os.path.join(work, args.arch + ".onnx"), os.path.join(work, args.arch + ".int8.onnx")
    info = export_model(args.arch, "random", fp32, log=lambda *a: None)
    preprocess = PreprocessConfig(**info["preprocess"])
    quantize_qdq(fp32, qdq, load_calibration_set(os.path.join(REPO, "calibration", "default")), preprocess,
                 show_progress=False, log=lambda *a: None)
    regression = load_calibration_set(os.path.join(REPO, "calibration", "regression"))
    hogs = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.load)]
    for hog in hogs:
        hog.start()
    try:
        seconds = {True: [], False: []}
        for _ in range(args.rounds):
            for spinning in (True, False):
                seconds[spinning].append(gate_seconds(fp32, qdq, regression, preprocess, spinning))
    finally:
        for hog in hogs:
            hog.terminate()
    on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
    print("gate on {} images, {} busy processes, median of {} rounds".format(len(regression), args.load, args.rounds))
    print("  spinning on : {:.2f} s  {}".format(on, " ".join("{:.2f}".format(s) for s in seconds[True])))
    print("  spinning off: {:.2f} s  {}".format(off, " ".join("{:.2f}".format(s) for s in seconds[False])))
    print("  on / off = {:.2f}x".format(on / off))


if __name__ == "__main__":
    main()
