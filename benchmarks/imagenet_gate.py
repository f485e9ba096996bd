#!/usr/bin/env python3
"""The accuracy gate at its defaults on trained ImageNet models and the labelled ImageNet set: sound INT8 must pass,
broken INT8 must fail.

    python benchmarks/imagenet_gate.py [--arch efficientnet_lite0 mobilenet_v2] [--set calibration/imagenet]

Per model (`edge export --arch A`, bundled ImageNet weights): Q/DQ INT8 made by the build's quantizer with the
config's defaults (build.method auto: the method closest to FP32 on the calibration images; exclude_sensitive) from
  sound          calibration/default, the model's own preprocessing
  grey           32 uniform grey images (as tests/test_real_weights.py)
  un-normalised  calibration/default fed as 0-255 values (mean 0, std 1/255)
  saturated      the sound model with every activation scale divided by F (activations clip; --saturate F...)
each judged (without the build's float fallback: docs/build.md measures it with `edge build`) by
edge.model.gate.evaluate with GateConfig() (the defaults) against the FP32 model on the labelled set
(edge calibrate imagenet), Q/DQ run by the build's runner (edge.model.plan.onnx_runner: TensorRT's arithmetic,
emulated). Prints one markdown row per candidate: the claims, the measures behind them, the number of labels the
claim rests on and the Q/DQ pairs (inputs fed through one; outside TensorRT's fusion placement: pairs it would have
to keep, edge.model.placement); docs/build.md (accuracy gate) has the table.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edge.config import BuildConfig, GateConfig, PreprocessConfig  # noqa: E402
from edge.model.auto_method import quantize  # noqa: E402
from edge.model.calibration import import_calibration_set, load_calibration_set  # noqa: E402
from edge.model.export import ARCHES, export_model  # noqa: E402
from edge.model.gate import evaluate  # noqa: E402
from edge.model.gate_stats import look_confidence  # noqa: E402
from edge.model.imagenet_set import DEFAULT_OUT  # noqa: E402
from edge.model.plan import onnx_runner  # noqa: E402
from edge.store.model_info import read_model_info  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SATURATE = (4.0,)
quiet = lambda *a: None  # noqa: E731


def grey_set(work):
    import cv2

    raw = os.path.join(work, "grey-raw")
    os.makedirs(raw, exist_ok=True)
    for i, level in enumerate(np.random.default_rng(0).integers(90, 170, 32)):
        cv2.imwrite(os.path.join(raw, "{:02d}.png".format(i)), np.full((240, 320, 3), level, np.uint8))
    return import_calibration_set(raw, os.path.join(work, "grey"), log=quiet)


def saturate(sound, out, factor):
    """`sound` with the scale of every activation QuantizeLinear (and so of its DequantizeLinear) / `factor`."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(sound)
    weights = {i.name: i for i in model.graph.initializer}
    scales = {n.input[1] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in weights}
    for name in scales:
        init = weights[name]
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) / np.float32(factor), name))
    onnx.save(model, out)


def candidates(fp32, pre, work, factors, only_saturated):
    """(name, Q/DQ path, seconds to make it) for each variant."""
    os.makedirs(work, exist_ok=True)
    calibration = load_calibration_set(os.path.join(REPO, "calibration", "default"), 1)
    unnorm = PreprocessConfig(**dict(vars(pre), mean=[0.0] * 3, std=[1 / 255] * 3))
    defaults = BuildConfig()
    variants = [("sound", calibration, pre), ("grey", grey_set(work), pre), ("un-normalised", calibration, unnorm)]
    for name, images, p in variants[:1] if only_saturated else variants:
        started = time.monotonic()
        summary = quantize(fp32, os.path.join(work, name + ".onnx"), images, p, defaults.method,
                           defaults.exclude_sensitive, show_progress=False, log=quiet)
        if not only_saturated:
            yield "{} ({})".format(name, summary["method"]), os.path.join(work, name + ".onnx"), \
                time.monotonic() - started
    for factor in factors:
        started = time.monotonic()
        out = os.path.join(work, "saturated-{:g}.onnx".format(factor))
        saturate(os.path.join(work, "sound.onnx"), out, factor)
        yield "saturated (scales / {:g})".format(factor), out, time.monotonic() - started


def qdq_pairs(fp32, candidate):
    """(inputs fed through a Q/DQ pair, how many of them lie outside TensorRT's fusion placement)."""
    import onnx

    from edge.model.placement import pairs_by_consumer, pairs_outside, residual_inputs

    model = onnx.load(candidate)
    return len(pairs_by_consumer(model)), pairs_outside(model, residual_inputs(onnx.load(fp32)))


def row(arch, name, r, quantize_s, pairs):
    lo, hi = r["top1_drop_interval_pp"]
    flo, fhi = r["confident_flip_interval_pct"]
    return ("| {} | {} | {:.1f} / {:.1f} | {} / {} | {:+.2f} ({:+.2f}..{:+.2f}) | {} of {} ({:.1f}..{:.1f} %) | "
            "{:.4f} / {:.4f} | {} / {} | {} | **{}** | {:.0f} + {:.0f} |").format(
        arch, name, 100 * r["reference_top1"], 100 * r["candidate_top1"], r["right_to_wrong"], r["wrong_to_right"],
        r["top1_drop_pp"], lo, hi, r["confident_flips"], r["confident_images"], flo, fhi, r["mean_cosine"],
        r["p5_cosine"], pairs[0], pairs[1], r["labelled"], r["verdict"], quantize_s, r["seconds"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", default=["efficientnet_lite0", "mobilenet_v2"], choices=list(ARCHES))
    parser.add_argument("--set", default=os.path.join(REPO, DEFAULT_OUT), help="the labelled ImageNet set")
    parser.add_argument("--saturate", nargs="+", type=float, default=SATURATE, help="activation scale divisors")
    parser.add_argument("--only-saturated", action="store_true", help="skip the sound, grey, un-normalised rows")
    args = parser.parse_args()
    labelled = load_calibration_set(args.set)
    gate = GateConfig()
    print("gate defaults: {}; {} labelled images; top-1 drop: Tango's 95 % interval; confident flips: "
          "Clopper-Pearson; a first look (96.96 %)".format(vars(gate), len(labelled)))
    print("| model | candidate (auto chose) | top-1 % FP32 / INT8 | right->wrong / wrong->right | top-1 drop pp "
          "(95 %) | confident flips (95 %) | cosine mean / p5 | Q/DQ inputs / outside placement | labels | verdict | "
          "seconds (make + gate) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for arch in args.arch:
            fp32 = os.path.join(work, arch + ".onnx")
            export_model(arch, "imagenet", fp32, log=quiet)
            pre = PreprocessConfig(**ARCHES[arch].preprocess)
            for name, candidate, made_s in candidates(fp32, pre, os.path.join(work, arch), args.saturate,
                                                    args.only_saturated):
                with onnx_runner(fp32) as reference, onnx_runner(candidate) as infer:  # a build's first look
                    result = evaluate(reference, infer, labelled, pre, gate, confidence=look_confidence(1),
                                      source_info=read_model_info(fp32))
                r = result.report
                print(row(arch, name, r, made_s, qdq_pairs(fp32, candidate)), flush=True)
                print("  FP32 top-1 {} of {} (interval {}, floor {}); collapsed classes {} (smallest spread ratio "
                      "{}); worst class {}".format(r["reference_right"], r["labelled"], r["reference_top1_interval"],
                                                   r["reference_floor"], [c["class"] for c in r["collapsed_classes"]],
                                                   r["min_spread_ratio"], r["worst_class"]), flush=True)
                print("  by kind of image: " + "; ".join(
                    "{stratum}: {labelled} labelled, FP32 {reference_top1:.3f} INT8 {candidate_top1:.3f}, "
                    "b {right_to_wrong} c {wrong_to_right}, drop {top1_drop_pp:+.2f} pp "
                    "({top1_drop_interval_pp})".format(**s)
                    for s in r.get("strata", []) if s["labelled"]), flush=True)
                print("  " + "; ".join(result.report["failures"] + result.report["inconclusive"] or
                                       result.report["claims"]), flush=True)


if __name__ == "__main__":
    main()
