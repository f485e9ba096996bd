"""Accuracy regression gate: a candidate (INT8 Q/DQ in ONNX Runtime, or a TensorRT engine) against the FP32
reference on the held-out regression set.

Both models see the same tensors, made by the runtime's CpuPreprocessor. Measured per image: the top-1 of
each, the cosine of the two logit vectors and, for labelled images, whether each is right (top-1/top-5).
Labels are subfolder names (`regression/<label>/img.png`): a label text from the model's labels file or a
class index. Every image counts for the logit cosine; top-1 agreement is judged on the unlabelled ones.

Labelled images give top-1/top-5 of both models, the flips each way (right->wrong, wrong->right) and the
drop's uncertainty: an exact interval from the discordant pairs (McNemar), so the verdict knows its sample size.
Agreement is not judged on them (a wrong answer turning into another wrong answer costs no accuracy; on photos a
network is unsure of, sound INT8 of MobileNetV2 agrees on 0.7). The verdict is "fail" (agreement on unlabelled
images or mean cosine below its threshold, or a top-1 drop above `max_top1_drop_pp` whose interval excludes no
change), "inconclusive" (a drop above the limit that the set cannot tell from chance: "too
few labelled images to judge a drop of X pp"; the build goes on and says so, docs/build.md) or "pass".
Thresholds (config `build.gate`) and the measurements behind them: docs/build.md, accuracy gate.
"""

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edge.build.calibration import CalibrationSet
from edge.config import GateConfig, PreprocessConfig
from edge.errors import EXIT_FAIL, EdgeError
from edge.fileio import write_json_atomic
from edge.frame.preprocess import CpuPreprocessor

Infer = Callable[[np.ndarray], np.ndarray]
MAX_FLIPS_LISTED = 100
CONFIDENCE = 0.95  # of the drop's interval; a drop is significant when the interval excludes 0


@dataclass
class GateResult:
    report: Dict[str, Any]

    @property
    def passed(self) -> bool:
        return bool(self.report["passed"])

    @property
    def failures(self) -> List[str]:
        return list(self.report["failures"])

    @property
    def verdict(self) -> str:
        """The log line's word: passed, FAILED, or inconclusive (too few labelled images to judge the drop seen)."""
        return {"pass": "passed", "fail": "FAILED"}.get(self.report["verdict"], self.report["verdict"])

    def summary(self) -> str:
        r = self.report
        text = "agreement {:.4f}, mean cosine {:.4f} (min {:.4f}), {} of {} flipped".format(
            r["agreement"], r["mean_cosine"], r["min_cosine"], len(r["flips"]) + r["flips_not_listed"], r["samples"])
        if r["labelled"]:
            lo, hi = r["top1_drop_interval_pp"]
            text += (", top-1 {:.2f}% -> {:.2f}% (drop {:+.2f} pp, {:.0f}% interval {:+.2f}..{:+.2f}; {} right->wrong, "
                     "{} wrong->right), top-5 {:.2f}% -> {:.2f}% of {} labelled").format(
                100 * r["reference_top1"], 100 * r["candidate_top1"], r["top1_drop_pp"], 100 * CONFIDENCE, lo, hi,
                r["right_to_wrong"], r["wrong_to_right"], 100 * r["reference_top5"], 100 * r["candidate_top5"],
                r["labelled"])
        return text + "".join("; inconclusive: " + reason for reason in r["inconclusive"])


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exact (log-space terms: no overflow for any n)."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    return min(1.0, sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                                 + i * log_p + (n - i) * log_q) for i in range(k, n + 1)))


def _solve(f: Callable[[float], float], target: float) -> float:
    """p in [0, 1] with f(p) = target, for f increasing in p (bisection to 1e-12)."""
    lo, hi = 0.0, 1.0
    for _ in range(45):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> Tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial proportion, k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    alpha = (1 - confidence) / 2
    lo = 0.0 if k == 0 else _solve(lambda p: _binomial_tail(k, n, p), alpha)
    hi = 1.0 if k == n else _solve(lambda p: _binomial_tail(k + 1, n, p), 1 - alpha)
    return lo, hi


def paired_drop(right_to_wrong: int, wrong_to_right: int, labelled: int,
                confidence: float = 0.95) -> Dict[str, Any]:
    """The top-1 drop of a candidate against its reference on the same labelled images, with its uncertainty.

    Only the discordant pairs carry information (McNemar): given d = b + c of them, b (right->wrong) is
    Binomial(d, pi) and the drop is d(2 pi - 1)/n. Returns the drop in pp, its exact interval (Clopper-Pearson on
    pi, conditional on d) and the exact one-sided McNemar p-value of "no drop" (P(B >= b) with pi = 1/2)."""
    b, c, n = right_to_wrong, wrong_to_right, labelled
    d = b + c
    lo, hi = clopper_pearson(b, d, confidence)
    scale = 100.0 * d / n if n else 0.0
    return {"top1_drop_pp": round(100.0 * (b - c) / n, 4) if n else 0.0,
            "top1_drop_interval_pp": [round(scale * (2 * lo - 1), 4), round(scale * (2 * hi - 1), 4)],
            "mcnemar_p": round(_binomial_tail(b, d, 0.5), 6)}


def resolve_labels(images: CalibrationSet, labels: Optional[Sequence[str]]) -> List[Optional[int]]:
    """Class index per image (None when unlabelled); an unknown subfolder name is an EdgeError."""
    lookup = {name: i for i, name in enumerate(labels or [])}
    out: List[Optional[int]] = []
    for name in images.files:
        label = images.label_of(name)
        if label is None:
            out.append(None)
        elif label in lookup:
            out.append(lookup[label])
        elif label.isdigit() and (labels is None or int(label) < len(labels)):
            out.append(int(label))
        else:
            raise EdgeError("{}: subfolder '{}' is neither a label in the model's labels file nor a class index".format(
                images.path(label), label))
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / denom) if denom > 0 else (1.0 if np.array_equal(a, b) else 0.0)


def _accuracy(ref: np.ndarray, cand: np.ndarray, truth: List[Optional[int]]) -> Dict[str, Any]:
    """Top-1/top-5 of both models on the labelled images, the flips each way and the drop's uncertainty."""
    rows = [i for i, t in enumerate(truth) if t is not None]
    if not rows:
        return {}
    label = np.asarray([truth[i] for i in rows])
    ref, cand = ref[rows], cand[rows]
    ref_right, cand_right = ref[:, 0] == label, cand[:, 0] == label
    out: Dict[str, Any] = {
        "reference_top1": round(float(ref_right.mean()), 6), "candidate_top1": round(float(cand_right.mean()), 6),
        "reference_top5": round(float((ref == label[:, None]).any(axis=1).mean()), 6),
        "candidate_top5": round(float((cand == label[:, None]).any(axis=1).mean()), 6),
        "right_to_wrong": int((ref_right & ~cand_right).sum()), "wrong_to_right": int((~ref_right & cand_right).sum()),
    }
    out["top5_drop_pp"] = round(100.0 * (out["reference_top5"] - out["candidate_top5"]), 4)
    out.update(paired_drop(out["right_to_wrong"], out["wrong_to_right"], len(rows), CONFIDENCE))
    return out


def _judge(report: Dict[str, Any], thresholds: GateConfig) -> None:
    """failures (any: "fail"), inconclusive (a drop above the limit that the set cannot tell from chance), verdict."""
    failures, inconclusive = [], []
    if report["samples"] == 0:
        failures.append("regression set is empty")
    unlabelled = report.get("unlabelled_agreement")
    if unlabelled is not None and unlabelled < thresholds.min_agreement:
        failures.append("top-1 agreement {:.4f} < {}{}".format(unlabelled, thresholds.min_agreement,
                                                              " on unlabelled images" if report["labelled"] else ""))
    if report["mean_cosine"] < thresholds.min_mean_cosine:
        failures.append("mean logit cosine {:.4f} < {}".format(report["mean_cosine"], thresholds.min_mean_cosine))
    if report["labelled"] and report["top1_drop_pp"] > thresholds.max_top1_drop_pp:
        lo, hi = report["top1_drop_interval_pp"]
        why = "{:.2f} pp ({:.0f}% interval {:+.2f}..{:+.2f} pp, {} right->wrong, {} wrong->right of {})".format(
            report["top1_drop_pp"], 100 * CONFIDENCE, lo, hi, report["right_to_wrong"], report["wrong_to_right"],
            report["labelled"])
        if lo > 0:
            failures.append("top-1 accuracy drop {} > {}".format(why, thresholds.max_top1_drop_pp))
        else:
            inconclusive.append("too few labelled images to judge a drop of " + why)
    report.update(failures=failures, inconclusive=inconclusive, passed=not failures,
                  verdict="fail" if failures else "inconclusive" if inconclusive else "pass")


def evaluate(reference: Infer, candidate: Infer, images: CalibrationSet, preprocess: PreprocessConfig,
             thresholds: GateConfig, labels: Optional[Sequence[str]] = None) -> GateResult:
    """Run both models over `images` and judge the candidate against `thresholds`.

    Verdict: "fail" when agreement (unlabelled images) or cosine is below its threshold, or the top-1 drop exceeds
    its limit and its exact interval excludes no change; "inconclusive" when the drop exceeds the limit but the set
    is too small to tell it from chance (the build goes on, saying so: docs/build.md); else "pass"."""
    started = time.monotonic()
    prep = CpuPreprocessor(preprocess)
    truth = resolve_labels(images, labels)
    ref_top5: List[np.ndarray] = []
    cand_top5: List[np.ndarray] = []
    cosines: List[float] = []
    flips: List[Dict[str, Any]] = []

    def name_of(i: int) -> Any:
        return labels[i] if labels is not None and i < len(labels) else i

    for name, label in zip(images.files, truth):
        tensor = prep(images.read(name))
        ref = np.asarray(reference(tensor), np.float32).reshape(-1)
        cand = np.asarray(candidate(tensor), np.float32).reshape(-1)
        ref_top5.append(np.argsort(-ref, kind="stable")[:5])
        cand_top5.append(np.argsort(-cand, kind="stable")[:5])
        cosines.append(_cosine(ref, cand))
        r, c = int(ref_top5[-1][0]), int(cand_top5[-1][0])
        if r != c:
            flips.append({"file": name, "reference": name_of(r), "candidate": name_of(c),
                          "label": None if label is None else name_of(label), "cosine": round(cosines[-1], 5)})
    n = len(images.files)
    top5 = [np.asarray(t, np.int64).reshape(n, -1) for t in (ref_top5, cand_top5)]
    report: Dict[str, Any] = {
        "samples": n, "labelled": sum(t is not None for t in truth), "regression_set": images.root,
        "regression_sha256": images.sha256,
        "agreement": round(float(np.mean(top5[0][:, 0] == top5[1][:, 0])), 6) if n else 0.0,
        "mean_cosine": round(float(np.mean(cosines)), 6) if n else 0.0,
        "min_cosine": round(float(np.min(cosines)), 6) if n else 0.0,
        "thresholds": {"min_agreement": thresholds.min_agreement, "min_mean_cosine": thresholds.min_mean_cosine,
                       "max_top1_drop_pp": thresholds.max_top1_drop_pp},
        "flips": flips[:MAX_FLIPS_LISTED], "flips_not_listed": max(0, len(flips) - MAX_FLIPS_LISTED),
    }
    unlabelled = [i for i, t in enumerate(truth) if t is None]
    if unlabelled:  # labelled images are judged by the accuracy drop: a wrong answer turning into another is no loss
        report["unlabelled_agreement"] = round(float(np.mean(top5[0][unlabelled, 0] == top5[1][unlabelled, 0])), 6)
    report.update(_accuracy(top5[0], top5[1], truth))
    _judge(report, thresholds)
    report["seconds"] = round(time.monotonic() - started, 2)
    return GateResult(report)


def write_report(path: str, result: GateResult, extra: Optional[Dict[str, Any]] = None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomic(path, dict(result.report, **(extra or {})))


def enforce(result: GateResult, report_path: str) -> None:
    """A failed gate is a failed build (exit 1), with the first reason and where the full report is."""
    if not result.passed:
        raise EdgeError("accuracy gate failed: {} ({}; report: {})".format(
            "; ".join(result.failures), result.summary(), report_path), exit_code=EXIT_FAIL)
