#!/usr/bin/env python3
"""Which gate metric separates sound INT8 from broken INT8, on two trained models at once.

    python benchmarks/gate_metrics.py [--cache DIR]

Models: EfficientNet-Lite0 (ImageNet weights, offline) on calibration/regression (100 unlabelled photo and
texture crops), and the digits MobileNetV3-Small of tests/trained_model.py (297 labelled held-out digits).
Candidates per model: sound Q/DQ INT8 (minmax, percentile; the build's calibration set) and two broken ones
(calibrated on uniform grey images; calibrated on un-normalised 0-255 inputs). Every candidate metric is
printed side by side; docs/build.md (accuracy gate) has the table and the choice. `--cache DIR` keeps the
logits so that changing a metric does not re-quantize.
"""

import argparse
import dataclasses
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from edge.build.calibration import CalibrationSet, import_calibration_set, load_calibration_set  # noqa: E402
from edge.build.export import ARCHES, export_model  # noqa: E402
from edge.build.plan import onnx_runner  # noqa: E402
from edge.build.quantize import quantize_qdq  # noqa: E402
from edge.config import PreprocessConfig  # noqa: E402
from edge.frame.preprocess import CpuPreprocessor  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
quiet = lambda *a: None  # noqa: E731
CONFIDENCE = (0.3, 0.5, 0.7)
EFFICIENTNET = "efficientnet_lite0"


def logits_of(model, images, pre):
    prep = CpuPreprocessor(pre)
    with onnx_runner(model) as run:
        return np.stack([np.asarray(run(prep(images.read(n))), np.float32).reshape(-1) for n in images.files])


def softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def cosines(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def metrics(ref, cand):
    """Every candidate metric of one candidate's logits against the reference's (N x classes each)."""
    p, q = softmax(ref.astype(np.float64)), softmax(cand.astype(np.float64))
    same = ref.argmax(1) == cand.argmax(1)
    logit_cos = cosines(ref, cand)
    out = {"agreement": same.mean(), "logit cos": logit_cos.mean(), "logit cos p10": np.percentile(logit_cos, 10),
           "prob cos": cosines(p, q).mean(), "KL(fp32||int8)": (p * np.log((p + 1e-30) / (q + 1e-30))).sum(1).mean(),
           "TV distance": 0.5 * np.abs(p - q).sum(1).mean()}
    top5 = np.argsort(-ref, 1)[:, :5]
    out["top1 in fp32 top5"] = np.mean([c in t for c, t in zip(cand.argmax(1), top5)])
    pmax = p.max(1)
    for t in CONFIDENCE:  # agreement only where FP32 is confident
        mask = pmax >= t
        out["agree p>={}".format(t)] = same[mask].mean() if mask.any() else float("nan")
        out["  images p>={}".format(t)] = int(mask.sum())
    return out


def effnet_candidates(work, calibration):
    """(name, preprocess used for calibration, calibration set, method) for EfficientNet-Lite0."""
    import cv2

    raw = os.path.join(work, "grey-raw")
    os.makedirs(raw, exist_ok=True)
    for i, level in enumerate(np.random.default_rng(0).integers(90, 170, 32)):  # as tests/test_real_weights.py
        cv2.imwrite(os.path.join(raw, "{:02d}.png".format(i)), np.full((240, 320, 3), level, np.uint8))
    grey = import_calibration_set(raw, os.path.join(work, "grey"), log=quiet)
    right = PreprocessConfig(**ARCHES[EFFICIENTNET].preprocess)
    first32 = CalibrationSet(calibration.root, calibration.files[:32], calibration.sha256, calibration.manifest)
    unnorm = PreprocessConfig(**dict(ARCHES[EFFICIENTNET].preprocess, mean=[0.0] * 3, std=[1 / 255] * 3))
    return right, [("minmax", right, calibration, "minmax"), ("percentile", right, calibration, "percentile"),
                   ("grey", right, grey, "minmax"), ("un-normalised", unnorm, first32, "minmax")]


def digits_candidates(d):
    cal = load_calibration_set(d.calibration)
    unnorm = dataclasses.replace(d.preprocess, mean=[0.0] * 3, std=[1 / 255.0] * 3)
    return d.preprocess, [("minmax", d.preprocess, cal, "minmax"), ("percentile", d.preprocess, cal, "percentile"),
                          ("grey", d.preprocess, load_calibration_set(d.grey_calibration), "minmax"),
                          ("un-normalised", unnorm, cal, "minmax")]


def quantized_logits(label, name, fp32, pre, images, method, right, regression, work):
    out = os.path.join(work, "{}-{}.onnx".format(label, name))
    # grey on digits quantizes everything, as tests/test_gate.py does; the rest keeps the build's sensitive nodes
    quantize_qdq(fp32, out, images, pre, method, not (label == "digits" and name == "grey"),
                 show_progress=False, log=quiet)
    return logits_of(out, regression, right)


def measure(label, fp32, right, candidates, regression, work, cache):
    """Logits of FP32 and of each candidate (cached under `cache`); returns {candidate: metrics}."""
    def cached(name, make):
        path = os.path.join(cache, "{}-{}.npy".format(label, name)) if cache else None
        if path and os.path.exists(path):
            return np.load(path)
        out = make()
        if path:
            np.save(path, out)
        return out

    ref = cached("fp32", lambda: logits_of(fp32(), regression, right))
    rows = {}
    for name, pre, images, method in candidates():
        args = (label, name, fp32(), pre, images, method, right, regression, work)
        rows[name] = metrics(ref, cached(name, lambda: quantized_logits(*args)))  # noqa: B023 (called at once)
        print("  {} {}: done".format(label, name), file=sys.stderr, flush=True)
    return rows


def print_table(tables):
    cols = [(m, c) for m, rows in tables.items() for c in rows]
    print("{:<18}".format("") + "".join("{:>14}".format(m) for m, _ in cols))
    print("{:<18}".format("metric") + "".join("{:>14}".format(c) for _, c in cols))
    for k in next(iter(next(iter(tables.values())).values())):
        vals = [tables[m][c][k] for m, c in cols]
        print("{:<18}".format(k) + "".join("{:>14}".format(v if isinstance(v, int) else "{:.4f}".format(v))
                                             for v in vals))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", help="folder for the logits (reused when present)")
    args = parser.parse_args()
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
    tables = {}
    with tempfile.TemporaryDirectory() as work:
        source = os.path.join(work, "efficientnet_lite0.onnx")
        once = {}

        def effnet():
            if not once:
                once["x"] = export_model(EFFICIENTNET, "auto", source, log=quiet)
            return source

        calibration = load_calibration_set(os.path.join(REPO, "calibration", "default"), 1)
        regression = load_calibration_set(os.path.join(REPO, "calibration", "regression"), 1)
        right, cands = effnet_candidates(work, calibration)
        tables["effnet"] = measure("effnet", effnet, right, lambda: cands, regression, work, args.cache)

        from trained_model import train_digits_model

        digit = {}

        def digits():
            if not digit:
                digit["d"] = train_digits_model(os.path.join(work, "digits"))
            return digit["d"]

        pre = PreprocessConfig(resize=64, crop=64)
        tables["digits"] = measure("digits", lambda: digits().onnx, pre, lambda: digits_candidates(digits())[1],
                                   load_calibration_set(digits().regression), work, args.cache)
    print_table(tables)


if __name__ == "__main__":
    main()
