"""Accuracy regression gate: a candidate (INT8 Q/DQ in ONNX Runtime, or a TensorRT engine) against the FP32
reference on the held-out regression set.

Both models see the same tensors, made by the runtime's CpuPreprocessor. Measured per image: the top-1 of
each, the cosine of the two logit vectors and, for labelled images, whether each is right (top-1/top-5).
Labels are subfolder names (`regression/<label>/img.png`): a label text from the model's labels file or a
class index. Images at the top level are unlabelled and count for agreement and cosine only.

Defaults (config `build.gate`, docs/build.md): agreement >= 0.98, mean cosine >= 0.99, top-1 drop <= 1 pp.
On a trained MobileNetV3-Small every sound INT8 variant measured agreement >= 0.99 and mean cosine
>= 0.9965 with |accuracy change| <= 0.34 pp, every broken one agreement <= 0.97 or cosine <= 0.95
(cpu-baseline.md); ONNX Runtime's int8 kernels alone flip 0-2 of 297 samples, hence the slack.
An ImageNet model on an unlabelled, texture-heavy set needs looser settings: sound INT8 of EfficientNet-Lite0
scores 0.86-0.89 / 0.969-0.971 there (docs/build.md, accuracy gate; benchmarks/gate_metrics.py).
"""

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from edge.build.calibration import CalibrationSet
from edge.config import GateConfig, PreprocessConfig
from edge.errors import EXIT_FAIL, EdgeError
from edge.frame.preprocess import CpuPreprocessor
from edge.modelinfo import write_json_atomic

Infer = Callable[[np.ndarray], np.ndarray]
MAX_FLIPS_LISTED = 100


@dataclass
class GateResult:
    report: Dict[str, Any]

    @property
    def passed(self) -> bool:
        return bool(self.report["passed"])

    @property
    def failures(self) -> List[str]:
        return list(self.report["failures"])

    def summary(self) -> str:
        r = self.report
        acc = ""
        if r["labelled"]:
            acc = ", top-1 {:.2f}% -> {:.2f}% ({:+.2f} pp)".format(
                100 * r["reference_top1"], 100 * r["candidate_top1"], -r["top1_drop_pp"])
        return "agreement {:.4f}, mean cosine {:.4f} (min {:.4f}), {} of {} flipped{}".format(
            r["agreement"], r["mean_cosine"], r["min_cosine"], len(r["flips"]) + r["flips_not_listed"],
            r["samples"], acc)


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


def evaluate(reference: Infer, candidate: Infer, images: CalibrationSet, preprocess: PreprocessConfig,
             thresholds: GateConfig, labels: Optional[Sequence[str]] = None) -> GateResult:
    """Run both models over `images` and judge the candidate against `thresholds`."""
    started = time.monotonic()
    prep = CpuPreprocessor(preprocess)
    truth = resolve_labels(images, labels)
    ref_top: List[int] = []
    cand_top: List[int] = []
    cosines: List[float] = []
    correct = {"reference_top1": 0, "candidate_top1": 0, "reference_top5": 0, "candidate_top5": 0}
    flips: List[Dict[str, Any]] = []
    for name, label in zip(images.files, truth):
        tensor = prep(images.read(name))
        ref = np.asarray(reference(tensor), np.float32).reshape(-1)
        cand = np.asarray(candidate(tensor), np.float32).reshape(-1)
        r, c = int(np.argmax(ref)), int(np.argmax(cand))
        cos = _cosine(ref, cand)
        ref_top.append(r)
        cand_top.append(c)
        cosines.append(cos)
        if label is not None:
            correct["reference_top1"] += r == label
            correct["candidate_top1"] += c == label
            correct["reference_top5"] += label in np.argsort(-ref)[:5]
            correct["candidate_top5"] += label in np.argsort(-cand)[:5]
        if r != c:
            def name_of(i: int) -> Any:
                return labels[i] if labels is not None and i < len(labels) else i
            flips.append({"file": name, "reference": name_of(r), "candidate": name_of(c),
                          "label": None if label is None else name_of(label), "cosine": round(cos, 5)})
    n = len(images.files)
    labelled = sum(t is not None for t in truth)
    agreement = float(np.mean(np.asarray(ref_top) == np.asarray(cand_top))) if n else 0.0
    report: Dict[str, Any] = {
        "samples": n, "labelled": labelled, "regression_set": images.root, "regression_sha256": images.sha256,
        "agreement": round(agreement, 6),
        "mean_cosine": round(float(np.mean(cosines)), 6) if n else 0.0,
        "min_cosine": round(float(np.min(cosines)), 6) if n else 0.0,
        "thresholds": {"min_agreement": thresholds.min_agreement, "min_mean_cosine": thresholds.min_mean_cosine,
                       "max_top1_drop_pp": thresholds.max_top1_drop_pp},
        "flips": flips[:MAX_FLIPS_LISTED], "flips_not_listed": max(0, len(flips) - MAX_FLIPS_LISTED),
    }
    if labelled:
        for key, value in correct.items():
            report[key] = round(value / labelled, 6)
        report["top1_drop_pp"] = round(100.0 * (report["reference_top1"] - report["candidate_top1"]), 4)
        report["top5_drop_pp"] = round(100.0 * (report["reference_top5"] - report["candidate_top5"]), 4)
    failures = []
    if n == 0:
        failures.append("regression set is empty")
    if report["agreement"] < thresholds.min_agreement:
        failures.append("top-1 agreement {:.4f} < {}".format(report["agreement"], thresholds.min_agreement))
    if report["mean_cosine"] < thresholds.min_mean_cosine:
        failures.append("mean logit cosine {:.4f} < {}".format(report["mean_cosine"], thresholds.min_mean_cosine))
    if labelled and report["top1_drop_pp"] > thresholds.max_top1_drop_pp:
        failures.append("top-1 accuracy drop {:.2f} pp > {}".format(report["top1_drop_pp"],
                                                                    thresholds.max_top1_drop_pp))
    report["failures"] = failures
    report["passed"] = not failures
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
