"""Which ONNX Runtime thread setting is fastest for batch-1 MobileNetV3 on this machine.

Interleaves the settings round by round (these machines are noisy) and prints p50/p99 and the ratio
to the default session options, which `backend.intra_op_threads: 0` keeps.

    .venv/bin/python benchmarks/ort_threads.py [--arch mobilenet_v3_large] [--rounds 8]
"""

import argparse
import os
import tempfile
import time

import numpy as np

from edge.infer.onnxruntime_backend import OnnxRuntimeBackend
from edge.model.export import export_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="mobilenet_v3_large")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()

    model = os.path.join(tempfile.mkdtemp(prefix="edge-ort-"), args.arch + ".onnx")
    export_model(args.arch, "random", model, log=lambda *a: None)
    settings = {"default (0)": (0, True), "1 thread": (1, True), "2 threads": (2, True), "0, no spin": (0, False)}
    backends = {name: OnnxRuntimeBackend(model, threads, spinning=spin).load()
                for name, (threads, spin) in settings.items()}
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    samples = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, backend in backends.items():
            for i in range(args.runs + 5):
                start = time.perf_counter()
                backend.infer(x)
                if i >= 5:
                    samples[name].append((time.perf_counter() - start) * 1e3)
    base = np.percentile(samples["default (0)"], 50)
    print("{} on {} cores, {} rounds x {} runs, ms".format(args.arch, os.cpu_count(), args.rounds, args.runs))
    for name, values in samples.items():
        p50, p99 = np.percentile(values, [50, 99])
        print("  {:<12} p50 {:6.3f}  p99 {:6.3f}  p50 / default {:.2f}".format(name, p50, p99, p50 / base))


if __name__ == "__main__":
    main()
