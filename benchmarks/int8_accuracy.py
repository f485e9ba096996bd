#!/usr/bin/env python3
"""FP32 vs TensorRT-style INT8 (Q/DQ in ONNX Runtime) on a trained model, per calibration method.

Trains the digits MobileNetV3-Small of tests/trained_model.py (~20 s on 2 cores), quantizes it with every
calibration method, with and without the sensitive nodes kept in float, plus two deliberately broken
calibrations, and prints one Markdown table: top-1 on the 297 held-out digits, top-1 agreement, logit cosine,
flips and the gate's verdict at the default thresholds. `--large` also times calibration + quantization of
MobileNetV3-Large (random weights) on the shipped calibration/default set.

    python benchmarks/int8_accuracy.py [--large] [--epochs N]
"""

import argparse
import dataclasses
import os
import resource
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from edge.config import GateConfig  # noqa: E402
from edge.errors import EdgeError  # noqa: E402
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend  # noqa: E402
from edge.model.calibration import load_calibration_set  # noqa: E402
from edge.model.gate import evaluate  # noqa: E402
from edge.model.quantize import quantize_qdq  # noqa: E402

from trained_model import EPOCHS, train_digits_model  # noqa: E402


def quiet(*_):
    pass


def digits_table(work, epochs):
    model = train_digits_model(os.path.join(work, "digits"), epochs=epochs)
    print("digits MobileNetV3-Small: {} epochs in {:.1f} s, torch top-1 {:.2%}\n".format(
        epochs, model.train_seconds, model.torch_top1))
    good = load_calibration_set(model.calibration)
    grey = load_calibration_set(model.grey_calibration)
    regression = load_calibration_set(model.regression)
    unnormalised = dataclasses.replace(model.preprocess, mean=[0.0, 0.0, 0.0], std=[1 / 255.0] * 3)
    variants = [(m, ex, "calibration set (64 digits)", good, model.preprocess)
                for m in ("minmax", "entropy", "percentile") for ex in (False, True)]
    variants += [("minmax", ex, "BROKEN: 32 grey images", grey, model.preprocess) for ex in (False, True)]
    variants += [("entropy", True, "BROKEN: grey images", grey, model.preprocess),
                 ("minmax", True, "BROKEN: un-normalised 0-255 inputs", good, unnormalised)]
    print("| method | sensitive in float | calibrated on | quantize s | FP32 top-1 | INT8 top-1 | change pp | "
          "agreement | mean cos | min cos | flips | gate |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with OnnxRuntimeBackend(model.onnx) as reference:
        for method, exclude, label, images, pre in variants:
            out = os.path.join(work, "{}-{}-{}.onnx".format(method, exclude, len(label)))
            started = time.monotonic()
            quantize_qdq(model.onnx, out, images, pre, method, exclude, show_progress=False, log=quiet)
            seconds = time.monotonic() - started
            with OnnxRuntimeBackend(out) as candidate:
                r = evaluate(reference.infer, candidate.infer, regression, model.preprocess, GateConfig(),
                             [str(i) for i in range(10)]).report
            print("| {} | {} | {} | {:.1f} | {:.2%} | {:.2%} | {:+.2f} | {:.4f} | {:.4f} | {:.4f} | {} | {} |".format(
                method, "yes" if exclude else "no", label, seconds, r["reference_top1"], r["candidate_top1"],
                -r["top1_drop_pp"], r["agreement"], r["mean_cosine"], r["min_cosine"],
                len(r["flips"]) + r["flips_not_listed"], r["verdict"]))


def large_timing(work):
    from edge.config import PreprocessConfig
    from edge.model.export import export_model

    src = os.path.join(work, "mobilenet_v3_large.onnx")
    export_model("mobilenet_v3_large", "random", src, log=quiet)
    images = load_calibration_set(os.path.join(ROOT, "calibration", "default"))
    print("\nMobileNetV3-Large (random weights), {} images of calibration/default, {} CPUs:\n".format(
        len(images), os.cpu_count()))
    print("| method | sensitive in float | calibrate + quantize + validate s |")
    print("|---|---|---|")
    for method in ("minmax", "entropy", "percentile"):
        for exclude in (True, False):
            started = time.monotonic()
            try:
                quantize_qdq(src, os.path.join(work, "large-int8.onnx"), images, PreprocessConfig(), method, exclude,
                             show_progress=False, log=quiet)
                result = "{:.1f}".format(time.monotonic() - started)
            except EdgeError as exc:
                result = "fails: " + str(exc).split(": ", 2)[-1]
            print("| {} | {} | {} |".format(method, "yes" if exclude else "no", result))
    from edge.config import load_config
    from edge.model.plan import check_inputs
    from edge.model.steps import run_build

    cfg = load_config(None, {"model.path": src, "build.engines_dir": os.path.join(work, "engines"),
                             "build.calibration_dir": os.path.join(ROOT, "calibration", "default"),
                             "build.regression_dir": os.path.join(ROOT, "calibration", "regression")})
    started = time.monotonic()
    run_build(check_inputs(cfg, show_progress=False), log=quiet)
    print("\nFull `edge build` (check inputs, minmax calibrate + quantize + validate, gate on 100 images, install): "
          "{:.1f} s; peak RSS of this process {:.2f} GB".format(
              time.monotonic() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large", action="store_true", help="also time MobileNetV3-Large quantization")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        digits_table(tmp, args.epochs)
        if args.large:
            large_timing(tmp)
