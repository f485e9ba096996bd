#!/usr/bin/env python3
"""ONNX Runtime's and NVIDIA ModelOpt's INT8 quantizers side by side, on MobileNetV3-Large and EfficientNet-Lite0.

    python benchmarks/quantizers.py [--arch efficientnet_lite0] [--quantizer modelopt] [--method minmax]

For each architecture x quantizer x calibration method: calibrate on calibration/default, quantize to Q/DQ with
the sensitive nodes in float (the build's defaults), then compare INT8 with FP32 in ONNX Runtime on
calibration/regression through the build's own gate (edge.model.gate.evaluate): top-1 agreement, mean logit
cosine, flipped samples, plus the Q/DQ node count, the output opset and the quantize time. Preprocessing comes
from each model's info (EfficientNet-Lite0: (x - 127) / 128). MobileNetV3 has no ImageNet weights offline, so it
runs with seeded random weights: its agreement says little (docs/build.md). Needs the `modelopt` extra for ModelOpt.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edge.config import GateConfig, PreprocessConfig  # noqa: E402
from edge.errors import EdgeError  # noqa: E402
from edge.infer.preprocess import model_preprocess  # noqa: E402
from edge.model.calibration import load_calibration_set  # noqa: E402
from edge.model.export import export_model  # noqa: E402
from edge.model.gate import evaluate  # noqa: E402
from edge.model.plan import onnx_runner  # noqa: E402
from edge.model.quantize import METHODS, MODELOPT_METHODS, QUANTIZERS, quantize_qdq  # noqa: E402
from edge.store.artifact import read_model_info  # noqa: E402

ARCHES = ("mobilenet_v3_large", "efficientnet_lite0")
COLUMNS = "{:<19} {:<12} {:<10} {:>9} {:>9} {:>6} {:>5} {:>5} {:>8}  {}"


def run_one(source, quantizer, method, calibration, regression, work):
    info = read_model_info(source)
    pre = model_preprocess(PreprocessConfig(), info, source, "defaults")
    out = os.path.join(work, "{}-{}-{}.onnx".format(os.path.basename(source)[:-5], quantizer, method))
    summary = quantize_qdq(source, out, calibration, pre, method, True, False, lambda *a: None, quantizer=quantizer)
    with onnx_runner(source) as reference, onnx_runner(out) as candidate:
        report = evaluate(reference, candidate, regression, pre, GateConfig()).report
    return summary, report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHES, action="append")
    parser.add_argument("--quantizer", choices=QUANTIZERS, action="append")
    parser.add_argument("--method", choices=METHODS, action="append")
    args = parser.parse_args()
    calibration = load_calibration_set("calibration/default", 1)
    regression = load_calibration_set("calibration/regression", 1)
    print(COLUMNS.format("arch", "quantizer", "method", "agreement", "mean cos", "flips", "Q/DQ", "opset",
                         "seconds", "gate"))
    with tempfile.TemporaryDirectory() as work:
        for arch in args.arch or ARCHES:
            source = os.path.join(work, arch + ".onnx")
            info = export_model(arch, "auto", source, log=lambda *a: None)
            for quantizer in args.quantizer or QUANTIZERS:
                methods = METHODS if quantizer == "onnxruntime" else tuple(MODELOPT_METHODS)
                for method in [m for m in methods if m in (args.method or methods)]:
                    name = arch + ("" if info["trained"] else "*")
                    try:
                        summary, r = run_one(source, quantizer, method, calibration, regression, work)
                    except EdgeError as exc:
                        print("{:<19} {:<12} {:<10} fails: {}".format(name, quantizer, method, exc), flush=True)
                        continue
                    print(COLUMNS.format(name, quantizer, method, "{:.4f}".format(r["agreement"]),
                                         "{:.4f}".format(r["mean_cosine"]), len(r["flips"]) + r["flips_not_listed"],
                                         summary["qdq_nodes"], summary["opset"], "{:.1f}".format(summary["seconds"]),
                                         r["verdict"]), flush=True)
    print("* untrained (seeded random weights): agreement on ~1e-10 logits is not a verdict")


if __name__ == "__main__":
    main()
