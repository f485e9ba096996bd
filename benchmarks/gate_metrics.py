#!/usr/bin/env python3
"""The gate's label-free thresholds, chosen on one split and reported on another, per architecture.

    python benchmarks/gate_metrics.py [--cache DIR] [--arch efficientnet_lite0 mobilenet_v2 digits]

Per architecture, FP32 and Q/DQ INT8 logits (Q/DQ placed as TensorRT fuses, run as TensorRT computes it: the
build's runner) for every calibration method and four calibrations: sound (calibration/default, the model's
preprocessing), grey (32 uniform grey images), un-normalised (0-255 inputs in calibration) and saturated (the sound
minmax model with every activation scale / 4). Judged sets: EfficientNet-Lite0 and MobileNetV2 on the 520 labelled
photos of calibration/imagenet; MobileNetV3-Small on the 297 held-out digits of tests/trained_model.py (the only
trained MobileNetV3 offline). Each judged set is split in two by image index (A: even, B: odd). For each candidate
the script prints, per split, the mean and 5th-percentile logit cosine, the changed answers among the images FP32 is
confident about (top-1 probability >= 0.5) with their exact 95 % interval, and the top-1 drop's 95 % interval; then
the thresholds the split-A values allow (below the worst sound candidate `auto` would choose, above the best broken
one) and what the defaults (edge.config.GateConfig) say on split B. `auto`'s choice is the method with the least
damage on the held-out half of calibration/default (edge.model.fidelity.split). `--cache DIR` keeps the logits.
"""

import argparse
import dataclasses
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from edge.config import GateConfig, PreprocessConfig  # noqa: E402
from edge.infer.preprocess import CpuPreprocessor  # noqa: E402
from edge.model.calibration import load_calibration_set  # noqa: E402
from edge.model.export import ARCHES, export_model  # noqa: E402
from edge.model.fidelity import split  # noqa: E402
from edge.model.gate import CONFIDENT, evaluate  # noqa: E402
from edge.model.gate_stats import clopper_pearson, paired_drop_interval  # noqa: E402
from edge.model.plan import onnx_runner  # noqa: E402
from edge.model.quantize import quantize_qdq  # noqa: E402

METHODS = ("minmax", "percentile", "entropy")
VARIANTS = ("sound", "grey", "unnorm")
quiet = lambda *a: None  # noqa: E731


def logits(model, images, pre):
    prep = CpuPreprocessor(pre)
    with onnx_runner(model) as run:
        return np.stack([np.asarray(run(prep(images.read(n))), np.float32).reshape(-1) for n in images.files])


def grey_set(work):
    from imagenet_gate import grey_set as make

    return make(work)


class Arch:
    """An architecture's FP32 model, preprocessing, calibration sets, judged set and labels."""

    def __init__(self, name, work):
        self.name, self.work = name, work
        os.makedirs(work, exist_ok=True)
        default = load_calibration_set(os.path.join(ROOT, "calibration", "default"))
        if name == "digits":
            from trained_model import train_digits_model

            d = train_digits_model(os.path.join(work, "digits"))
            self.fp32, self.pre = d.onnx, d.preprocess
            self.calibration, self.grey = load_calibration_set(d.calibration), load_calibration_set(d.grey_calibration)
            self.judged = load_calibration_set(d.regression)
        else:
            self.fp32 = os.path.join(work, name + ".onnx")
            export_model(name, "imagenet", self.fp32, log=quiet)
            self.pre = PreprocessConfig(**ARCHES[name].preprocess)
            self.calibration, self.grey = default, grey_set(work)
            self.judged = load_calibration_set(os.path.join(ROOT, "calibration", "imagenet"))
        self.held_out = split(self.calibration)[1]
        self.truth = np.asarray([int(f.split("/")[0]) for f in self.judged.files])

    def sets(self):
        return {"judged": self.judged, "held_out": self.held_out}

    def candidate(self, variant, method):
        out = os.path.join(self.work, "{}.{}.{}.onnx".format(self.name, variant, method))
        pre = dataclasses.replace(self.pre, mean=[0.0] * 3, std=[1 / 255] * 3) if variant == "unnorm" else self.pre
        quantize_qdq(self.fp32, out, self.grey if variant == "grey" else self.calibration, pre, method, True,
                     show_progress=False, log=quiet)
        return out


def cached_logits(arch, cache, name, make_model):
    path = os.path.join(cache, "{}.{}.npz".format(arch.name, name))
    if not os.path.exists(path):
        model = make_model()
        np.savez(path, **{k: logits(model, s, arch.pre) for k, s in arch.sets().items()})
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def saturated(sound, out, factor=4.0):
    from imagenet_gate import saturate

    saturate(sound, out, factor)
    return out


def softmax_top(x):
    z = x.astype(np.float64) - x.max(1, keepdims=True)
    return 1.0 / np.exp(z).sum(1)


def measures(ref, cand, truth, rows):
    r, c, t = ref[rows], cand[rows], truth[rows]
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(c, axis=1)
    cos = np.where(np.isfinite(norms) & (norms > 0), (r * c).sum(1) / np.where(norms > 0, norms, 1), -1.0)
    confident = softmax_top(r) >= CONFIDENT
    flipped = r.argmax(1) != c.argmax(1)
    k, m = int((flipped & confident).sum()), int(confident.sum())
    right_r, right_c = r.argmax(1) == t, c.argmax(1) == t
    b, cc = int((right_r & ~right_c).sum()), int((~right_r & right_c).sum())
    return {"mean": float(cos.mean()), "p5": float(np.percentile(cos, 5)), "k": k, "m": m,
            "flip_hi": 100 * clopper_pearson(k, m)[1], "flip_lo": 100 * clopper_pearson(k, m)[0],
            "drop": [100 * x for x in paired_drop_interval(b, cc, len(rows))]}


def damage(ref, cand):
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    return float(np.mean(1 - (ref * cand).sum(1) / np.where(norms > 0, norms, 1)))


def full_set_report(ref, cand, images, gate):
    """edge.model.gate.evaluate itself on cached logits: each image read returns a stand-in frame, each model the
    row of its logits for the image last read."""
    from edge.model.calibration import CalibrationSet

    rows = {name: i for i, name in enumerate(images.files)}
    current = {}

    class Cached(CalibrationSet):
        def read(self, name):
            current["row"] = rows[name]
            return np.zeros((32, 32, 3), np.uint8)

    cached = Cached(images.root, images.files, images.sha256)
    return evaluate(lambda t: ref[current["row"]][None], lambda t: cand[current["row"]][None], cached,
                    PreprocessConfig(resize=32, crop=32), gate).report


def verdict(m, gate):
    if m["mean"] < gate.min_mean_cosine or m["p5"] < gate.min_p5_cosine or m["flip_lo"] > gate.max_confident_flip_pct \
            or m["drop"][0] > gate.max_top1_drop_pp:
        return "fail"
    if m["flip_hi"] <= gate.max_confident_flip_pct and m["drop"][1] <= gate.max_top1_drop_pp:
        return "pass"
    return "inconclusive"


def report(arch, cache):
    ref = cached_logits(arch, cache, "fp32", lambda: arch.fp32)
    cands = {}
    for variant in VARIANTS:
        for method in METHODS:
            try:
                cands[(variant, method)] = cached_logits(arch, cache, "{}.{}".format(variant, method),
                                                         lambda: arch.candidate(variant, method))  # noqa: B023
            except Exception as exc:  # e.g. percentile's "Too many bins"
                print("  {} {} {}: {}".format(arch.name, variant, method, exc), file=sys.stderr)
    sound = os.path.join(arch.work, "{}.sound.minmax.onnx".format(arch.name))
    cands[("saturated", "minmax")] = cached_logits(
        arch, cache, "saturated.minmax", lambda: saturated(sound if os.path.exists(sound) else
                                                           arch.candidate("sound", "minmax"),
                                                           os.path.join(arch.work, arch.name + ".saturated.onnx")))
    chosen = {v: min((m for (vv, m) in cands if vv == v), key=lambda m: damage(ref["held_out"],
                                                                               cands[(v, m)]["held_out"]))
              for v in VARIANTS + ("saturated",)}
    n = len(arch.truth)
    halves = {"A": np.arange(0, n, 2), "B": np.arange(1, n, 2)}
    gate = GateConfig()
    print("\n{} ({} judged images, halves of {}/{})".format(arch.name, n, len(halves["A"]), len(halves["B"])))
    print("| candidate | auto | A: mean / p5 cos | A: confident flips | B: mean / p5 cos | B: confident flips "
          "(95 %) | B: top-1 drop 95 % | B: verdict (defaults) |")
    print("|---|---|---|---|---|---|---|---|")
    table = {}
    for (variant, method), cand in sorted(cands.items()):
        a, b = (measures(ref["judged"], cand["judged"], arch.truth, halves[h]) for h in "AB")
        table[(variant, method)] = a
        print("| {} {} | {} | {:.4f} / {:.4f} | {}/{} | {:.4f} / {:.4f} | {}/{} ({:.1f}..{:.1f} %) | "
              "{:+.2f}..{:+.2f} pp | {} |".format(
                  variant, method, "yes" if chosen[variant] == method else "", a["mean"], a["p5"], a["k"], a["m"],
                  b["mean"], b["p5"], b["k"], b["m"], b["flip_lo"], b["flip_hi"], b["drop"][0], b["drop"][1],
                  verdict(b, gate)))
    print("\nthe whole set, judged by edge.model.gate.evaluate with the defaults:")
    print("| candidate (auto's method) | top-1 % FP32 / INT8 | right->wrong / wrong->right | top-1 drop (95 %) | "
          "confident flips (95 %) | cosine mean / p5 | labels | verdict | claims or failures |")
    print("|---|---|---|---|---|---|---|---|---|")
    for variant in VARIANTS + ("saturated",):
        r = full_set_report(ref["judged"], cands[(variant, chosen[variant])]["judged"], arch.judged, gate)
        lo, hi = r["top1_drop_interval_pp"]
        print("| {} ({}) | {:.1f} / {:.1f} | {} / {} | {:+.2f} ({:+.2f}..{:+.2f}) | {} of {} ({:.1f}..{:.1f} %) | "
              "{:.4f} / {:.4f} | {} | **{}** | {} |".format(
                  variant, chosen[variant], 100 * r["reference_top1"], 100 * r["candidate_top1"], r["right_to_wrong"],
                  r["wrong_to_right"], r["top1_drop_pp"], lo, hi, r["confident_flips"], r["confident_images"],
                  *r["confident_flip_interval_pct"], r["mean_cosine"], r["p5_cosine"], r["labelled"], r["verdict"],
                  "; ".join(r["failures"] or r["inconclusive"] or r["claims"])))
    good = table[("sound", chosen["sound"])]
    bad = [table[(v, chosen[v])] for v in ("grey", "unnorm", "saturated")]
    for key in ("mean", "p5"):
        print("split A, {} cosine: sound (auto) {:.4f}; broken (auto) at most {:.4f}".format(
            key, good[key], max(x[key] for x in bad)))


def main():
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", help="folder for the logits (reused when present)")
    parser.add_argument("--arch", nargs="+", default=["efficientnet_lite0", "mobilenet_v2", "digits"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        cache = args.cache or os.path.join(work, "cache")
        os.makedirs(cache, exist_ok=True)
        for name in args.arch:
            report(Arch(name, os.path.join(work, name)), cache)


if __name__ == "__main__":
    main()
