"""N cameras on one engine: served one frame at a time against the deadline batcher, side by side in one run.

MobileNetV3-Large exported with a batch axis (seeded random weights: latency is real), ONNX Runtime on this CPU,
1280x720 synthetic cameras with their own phase and jitter, through the service's loop (edge sweep's windows).
Rounds interleave the two ways (these machines are noisy). Prints, per camera count, the results per second within
the budget (goodput), the p99 end to end and the drop rate of each, and their ratios; then the engine's raw
capacity at batch 1 and batch N (closed loop).

    .venv/bin/python benchmarks/batching.py [--cameras 2,4] [--fps 30] [--rounds 4] [--seconds 5]

On a few CPU cores ONNX Runtime already spreads one image over the cores, so batching may buy little here; the
Orin's GPU is where it is expected to pay (docs/throughput.md, on paper until a device runs this).
"""

import argparse
import os
import tempfile

import numpy as np

from edge.bench.sweep_run import closed_window, open_window, synthetic_frames
from edge.config import load_config
from edge.infer.stages import build_stages
from edge.model.export import export_model


def pooled(windows, budget_ms):
    e2e = np.concatenate([w.stage_ms["end_to_end"] for w in windows])
    seconds = sum(w.seconds for w in windows)
    ok = sum(sum(w.ok) for w in windows)
    produced, dropped = sum(w.produced for w in windows), sum(w.dropped for w in windows)
    sizes = np.concatenate([w.batch for w in windows])
    return {"goodput": ok / seconds, "achieved": len(e2e) / seconds, "p99": float(np.percentile(e2e, 99)),
            "drop": 100.0 * dropped / max(1, produced), "batch": float(np.mean(sizes)),
            "within": float(np.mean(e2e <= budget_ms))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", default="2,4")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per window")
    parser.add_argument("--budget-ms", type=float, default=30.0)
    args = parser.parse_args()
    cameras = [int(c) for c in args.cameras.split(",")]

    model = os.path.join(tempfile.mkdtemp(prefix="edge-batching-"), "mobilenet_v3_large.onnx")
    export_model("mobilenet_v3_large", "random", model, log=lambda *a: None, batch="dynamic")
    cfg = load_config(None, {"model.path": model, "backend.kind": "onnxruntime", "preprocess.device": "cpu",
                             "runtime.budget_ms": args.budget_ms, "service.telemetry.enabled": False,
                             "runtime.latency_window": 100000})
    stages = build_stages(cfg)
    frames = synthetic_frames(cfg)
    ways = {"one by one": lambda n: 1, "batched": lambda n: n}
    runs = {(n, way): [] for n in cameras for way in ways}
    capacity = {b: [] for b in sorted({1} | set(cameras))}
    try:
        for r in range(args.rounds):
            for n in cameras:
                for way, batch in ways.items():
                    runs[(n, way)].append(open_window(cfg, stages, frames, streams=n, batch=batch(n), fps=args.fps,
                                                      jitter_s=0.002, seconds=args.seconds, seed=100 * r + n))
            for b in capacity:
                capacity[b].append(closed_window(stages, frames[0], batch=b, seconds=args.seconds / 2,
                                                 budget_ms=args.budget_ms))
            print("round {}/{} done".format(r + 1, args.rounds), flush=True)
    finally:
        stages.close()

    print("\nMobileNetV3-Large (random weights), ONNX Runtime, {} cores, 1280x720 cameras at {:g} fps, budget {:g} "
          "ms, {} rounds x {:g} s".format(os.cpu_count(), args.fps, args.budget_ms, args.rounds, args.seconds))
    print("{:>7} {:<11} {:>9} {:>9} {:>8} {:>7} {:>7} {:>7}".format("cameras", "served", "goodput", "achieved",
                                                                   "p99 ms", "drop%", "batch", "in-bud"))
    for n in cameras:
        figures = {way: pooled(runs[(n, way)], args.budget_ms) for way in ways}
        for way, f in figures.items():
            print("{:>7} {:<11} {:>9.1f} {:>9.1f} {:>8.2f} {:>7.2f} {:>7.2f} {:>6.1%}".format(
                n, way, f["goodput"], f["achieved"], f["p99"], f["drop"], f["batch"], f["within"]))
        one, many = figures["one by one"], figures["batched"]
        print("{:>7} batched / one by one: goodput {:.2f}x, p99 {:.2f}x".format(
            n, many["goodput"] / max(one["goodput"], 1e-9), many["p99"] / one["p99"]))
    print("\nengine capacity, batches back to back (closed loop):")
    base = pooled(capacity[1], args.budget_ms)["achieved"]
    for b, windows in capacity.items():
        f = pooled(windows, args.budget_ms)
        print("  batch {:>2}: {:7.1f} images/s ({:.2f}x batch 1), p99 per batch {:.2f} ms".format(
            b, f["achieved"], f["achieved"] / base, f["p99"]))


if __name__ == "__main__":
    main()
