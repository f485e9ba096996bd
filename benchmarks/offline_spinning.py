"""Whether the build's offline ONNX Runtime sessions (accuracy gate, float-fallback ranking) should let idle
threads spin, and how many threads they should run, on a machine other work keeps busy (a shared build machine,
a CI runner, a Jetson running its service).

The gate alternates two sessions (FP32 reference, Q/DQ candidate emulated) image by image; with spinning on,
the idle one's threads busy-wait for work that goes to the other. Runs the real `evaluate` on the shipped
regression set, spinning on and off interleaved round by round, with `--load` busy processes competing
(default: one per core), and prints seconds per round and the ratio.

`--calibration` measures the calibrator instead (edge.model.quantize.compute_ranges, minmax, on the shipped
calibration set): ONNX Runtime's own session (graph optimisations off, threads spinning) against
edge.model.quantize.calibration_session, wall and CPU seconds, and the largest relative difference of the ranges.

`--threads` measures the gate (neither spinning) with ONNX Runtime's default thread count (one per core) against
one thread (edge.infer.onnxruntime_backend.OFFLINE_THREADS), wall and CPU seconds; `--load 0` runs it idle.

    .venv/bin/python benchmarks/offline_spinning.py [--arch mobilenet_v3_small] [--rounds 3] [--load N]
                                                    [--calibration | --threads]
"""

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time

import numpy as np

from edge.config import GateConfig, PreprocessConfig
from edge.infer.onnxruntime_backend import OFFLINE_THREADS, OnnxRuntimeBackend
from edge.model import quantize
from edge.model.calibration import load_calibration_set
from edge.model.export import export_model
from edge.model.gate import evaluate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def busy() -> None:
    while True:
        pass


def gate_seconds(fp32: str, qdq: str, regression, preprocess, spinning: bool, threads: int = 0):
    """(wall s, CPU s) of one gate run."""
    wall, cpu = time.monotonic(), time.process_time()
    with OnnxRuntimeBackend(fp32, threads, spinning=spinning) as reference, \
            OnnxRuntimeBackend(qdq, threads, spinning=spinning, emulate_int8=True) as candidate:
        evaluate(reference, candidate, regression, preprocess, GateConfig())
    return time.monotonic() - wall, time.process_time() - cpu


def calibration_run(fp32: str, images, preprocess, ours: bool):
    """(wall s, CPU s, ranges) of one minmax calibration with our session or ONNX Runtime's own."""
    own = quantize.calibration_session
    if not ours:
        quantize.calibration_session = lambda calibrator: calibrator.infer_session
    try:
        with tempfile.TemporaryDirectory() as work:
            wall, cpu = time.monotonic(), time.process_time()
            ranges = quantize.compute_ranges(fp32, images, preprocess, "minmax", work, show_progress=False)
            return time.monotonic() - wall, time.process_time() - cpu, ranges
    finally:
        quantize.calibration_session = own


def compare_calibration(fp32: str, preprocess, rounds: int) -> None:
    images = load_calibration_set(os.path.join(REPO, "calibration", "default"))
    runs = {True: [], False: []}
    for _ in range(rounds):
        for ours in (False, True):
            runs[ours].append(calibration_run(fp32, images, preprocess, ours))
    theirs, mine = runs[False][-1][2], runs[True][-1][2]
    diff = max(float(np.max(np.abs(np.subtract(mine[k].range_value, theirs[k].range_value))
                            / (np.max(np.abs(theirs[k].range_value)) + 1e-12))) for k in theirs.data)
    for ours, name in ((False, "ONNX Runtime's session"), (True, "calibration_session")):
        print("  {:22s}: wall {:.2f} s, CPU {:.2f} s (medians of {})".format(
            name, statistics.median(r[0] for r in runs[ours]), statistics.median(r[1] for r in runs[ours]), rounds))
    print("  CPU ORT's / ours = {:.2f}x, wall = {:.2f}x; ranges differ by at most {:.1e} (relative)".format(
        statistics.median(r[1] for r in runs[False]) / statistics.median(r[1] for r in runs[True]),
        statistics.median(r[0] for r in runs[False]) / statistics.median(r[0] for r in runs[True]), diff))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="mobilenet_v3_small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy processes competing")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--calibration", action="store_true", help="measure the calibrator's session instead")
    mode.add_argument("--threads", action="store_true", help="measure the gate's thread count instead")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="edge-spin-")
    fp32, qdq = os.path.join(work, args.arch + ".onnx"), os.path.join(work, args.arch + ".int8.onnx")
    info = export_model(args.arch, "random", fp32, log=lambda *a: None)
    preprocess = PreprocessConfig(**info["preprocess"])
    if not args.calibration:
        quantize.quantize_qdq(fp32, qdq, load_calibration_set(os.path.join(REPO, "calibration", "default")),
                              preprocess, show_progress=False, log=lambda *a: None)
    hogs = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.load)]
    for hog in hogs:
        hog.start()
    try:
        if args.calibration:
            print("calibration of {}, {} busy processes".format(args.arch, args.load))
            compare_calibration(fp32, preprocess, args.rounds)
        elif args.threads:
            compare_threads(fp32, qdq, preprocess, args.load, args.rounds)
        else:
            compare_gate(fp32, qdq, preprocess, args.load, args.rounds)
    finally:
        for hog in hogs:
            hog.terminate()


def compare_gate(fp32: str, qdq: str, preprocess, load: int, rounds: int) -> None:
    regression = load_calibration_set(os.path.join(REPO, "calibration", "regression"))
    seconds = {True: [], False: []}
    for _ in range(rounds):
        for spinning in (True, False):
            seconds[spinning].append(gate_seconds(fp32, qdq, regression, preprocess, spinning)[0])
    on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
    print("gate on {} images, {} busy processes, median of {} rounds".format(len(regression), load, rounds))
    print("  spinning on : {:.2f} s  {}".format(on, " ".join("{:.2f}".format(s) for s in seconds[True])))
    print("  spinning off: {:.2f} s  {}".format(off, " ".join("{:.2f}".format(s) for s in seconds[False])))
    print("  on / off = {:.2f}x".format(on / off))


def compare_threads(fp32: str, qdq: str, preprocess, load: int, rounds: int) -> None:
    regression = load_calibration_set(os.path.join(REPO, "calibration", "regression"))
    runs = {0: [], OFFLINE_THREADS: []}
    for _ in range(rounds):
        for threads in runs:
            runs[threads].append(gate_seconds(fp32, qdq, regression, preprocess, False, threads))
    print("gate on {} images, {} busy processes, not spinning, median of {} rounds".format(
        len(regression), load, rounds))
    wall, cpu = ({t: statistics.median(r[i] for r in runs[t]) for t in runs} for i in (0, 1))
    for threads in runs:
        print("  threads {:4s}: wall {:.2f} s, CPU {:.2f} s".format(str(threads or "auto"), wall[threads],
                                                                    cpu[threads]))
    print("  auto / {}: CPU {:.2f}x, wall {:.2f}x".format(OFFLINE_THREADS, cpu[0] / cpu[OFFLINE_THREADS],
                                                       wall[0] / wall[OFFLINE_THREADS]))


if __name__ == "__main__":
    main()
