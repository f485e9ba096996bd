"""Accuracy regression gate: a candidate (INT8 Q/DQ in the Q/DQ graph's FP32 semantics, or a TensorRT engine)
against the FP32 reference on the held-out regression set, with a verdict that states what it proves.

Both models see the same tensors, made by the runtime's CpuPreprocessor. Per image: the top-1 of each, the cosine of
the two logit vectors, FP32's softmax confidence and, for labelled images (`regression/<label>/img.png`), whether
each is right. Claims (edge.model.gate_stats):

- labelled images: the top-1 drop is non-inferior: its 95 % upper bound (Tango's interval) within
  `max_top1_drop_pp` passes, its lower bound beyond the limit fails, anything else is inconclusive ("cannot tell: a
  N pp limit needs ~M labelled images").
- every image: among the images FP32 is confident about (top-1 probability >= CONFIDENT), the rate of changed
  top-1 answers, with its exact (Clopper-Pearson) interval against `max_confident_flip_pct` in the same way; the
  tails and the centre of the logit cosine (`min_p5_cosine`, `min_mean_cosine`) and top-1 agreement on unlabelled
  images (`min_agreement`) fail below their thresholds.
- any NaN or Inf in either model's outputs fails, naming the image; every comparison is written so NaN cannot pass.
- FP32 outputs near the uniform distribution (untrained weights) cannot be judged: a failure when enforced.
- the FP32 reference, the labels and every class (edge.model.gate_checks): FP32 below its recorded top-1 or k x
  chance, a permuted labels file, a collapsed class: failures; per-class recall, the worst class in the claim.
- by kind of image (edge.model.gate_strata): the claim names the images it rests on; a stratum alone beyond the
  limit fails.
- every interval at `confidence`: a build's look k at one set is judged at gate_stats.look_confidence(k)
  (edge.model.gate_looks counts the looks); the claim is stated against FP32 ("INT8 keeps X of FP32's Y % top-1").

The verdict: "fail" when anything fails, "pass" when every claim passes, else "inconclusive", which installs
nothing unless the build is told --accept-inconclusive (edge.model.steps). Thresholds (config `build.gate`) and the
measurements behind them: docs/build.md, accuracy gate.
"""

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from edge.config import GateConfig, PreprocessConfig
from edge.errors import EXIT_FAIL, MAX_LINE_CHARS, EdgeError
from edge.infer.preprocess import CpuPreprocessor
from edge.model.calibration import CalibrationSet
from edge.model.class_labels import index_of_name, is_index, label_lines
from edge.model.gate_checks import (
    collapse_failure,
    collapsed_classes,
    labels_failure,
    per_class,
    reference_check,
)
from edge.model.gate_stats import clopper_pearson, percent, top1_claim
from edge.model.gate_strata import by_stratum, stratum_names
from edge.store.fileio import write_json_atomic

Infer = Callable[[np.ndarray], np.ndarray]
MAX_FLIPS_LISTED = 100
CONFIDENCE = 0.95  # of every interval
CONFIDENT = 0.5  # FP32 top-1 softmax probability from which an image counts as one FP32 is confident about
NEAR_UNIFORM = 2.0  # FP32 outputs are near-uniform when 95 % of images' top-1 probability is below 2 / classes


@dataclass
class GateResult:
    report: Dict[str, Any]

    @property
    def passed(self) -> bool:
        return self.report["verdict"] == "pass"

    @property
    def failures(self) -> List[str]:
        return list(self.report["failures"])

    @property
    def verdict(self) -> str:
        """The log line's word: passed, FAILED, or inconclusive (the set cannot carry the claim)."""
        return {"pass": "passed", "fail": "FAILED"}.get(self.report["verdict"], self.report["verdict"])

    def summary(self) -> str:
        r = self.report
        text = "mean cosine {} (p5 {}), {} of {} confident images flipped, agreement {}".format(
            _shown(r["mean_cosine"]), _shown(r["p5_cosine"]), r["confident_flips"], r["confident_images"],
            _shown(r["agreement"]))
        text += "".join("; " + claim for claim in r["claims"] + r.get("warnings", []))  # inconclusive: "cannot tell"
        if r.get("calibration_overlap_dropped"):
            text += "; {} regression images also in the calibration set were left out{}".format(
                r["calibration_overlap_dropped"], " ({} of them near-duplicates)".format(
                    r["calibration_near_duplicates"]) if r.get("calibration_near_duplicates") else "")
        return text


def _shown(value: Optional[float]) -> str:
    return "n/a" if value is None else "{:.4f}".format(value)


def resolve_labels(images: CalibrationSet, labels: Optional[Sequence[str]]) -> List[Optional[int]]:
    """Class index per image (None when unlabelled); a subfolder naming no class of the model is an EdgeError that
    says how many do not (a set labelled for another model: 1000 ImageNet folders against 5 classes)."""
    lines = label_lines(labels)
    out: List[Optional[int]] = []
    unknown: List[str] = []
    for name in images.files:
        label = images.label_of(name)
        line = None if label is None else index_of_name(label, lines, images.root)
        if label is None:
            out.append(None)
        elif line is not None:
            out.append(line)
        elif is_index(label) and (labels is None or int(label) < len(labels)):
            out.append(int(label))
        elif label not in unknown:
            unknown.append(label)
    if len(unknown) == 1:
        raise EdgeError("{}: subfolder '{}' is neither a label in the model's labels file nor a class index".format(
            images.path(unknown[0]), unknown[0]))
    if unknown:
        folders = {images.label_of(name) for name in images.files} - {None}
        raise EdgeError("{}: labelled for another model: {} of its {} class folders ({}, ...) name no class of the "
                        "model's {} labels; use your own labelled images (docs/own-model.md)".format(
                            images.path(""), len(unknown), len(folders), ", ".join(unknown[:2]),
                            len(labels or [])))
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two finite vectors; -1 (the worst) for anything non-finite, so NaN never passes."""
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    if not (np.isfinite(denom) and np.isfinite(a).all() and np.isfinite(b).all()):
        return -1.0
    return float(a @ b / denom) if denom > 0 else (1.0 if np.array_equal(a, b) else 0.0)


def _top_probability(logits: np.ndarray) -> float:
    if not np.isfinite(logits).all():
        return 0.0
    z = logits.astype(np.float64) - logits.max()
    return float(1.0 / np.exp(z).sum())


def _non_finite(name: str, which: str, out: np.ndarray) -> Optional[Dict[str, Any]]:
    bad = ~np.isfinite(out)
    if not bad.any():
        return None
    return {"file": name, "model": which, "nan": int(np.isnan(out).sum()), "inf": int(np.isinf(out).sum())}


def _accuracy(ref: np.ndarray, cand: np.ndarray, truth: List[Optional[int]], limit: float, confidence: float,
              name_of: Callable[[int], Any], candidate_name: str) -> Dict[str, Any]:
    """Top-1/top-5 of both models on the labelled images, the flips each way, per class, and the non-inferiority
    claim stated against FP32's own top-1."""
    rows = [i for i, t in enumerate(truth) if t is not None]
    if not rows:
        return {}
    label = np.asarray([truth[i] for i in rows])
    ref, cand = ref[rows], cand[rows]
    ref_right, cand_right = ref[:, 0] == label, cand[:, 0] == label
    b, c = int((ref_right & ~cand_right).sum()), int((~ref_right & cand_right).sum())
    out: Dict[str, Any] = {
        "reference_top1": round(float(ref_right.mean()), 6), "candidate_top1": round(float(cand_right.mean()), 6),
        "reference_top5": round(float((ref == label[:, None]).any(axis=1).mean()), 6),
        "candidate_top5": round(float((cand == label[:, None]).any(axis=1).mean()), 6),
        "reference_right": int(ref_right.sum()),
        "right_to_wrong": b, "wrong_to_right": c, "top1_drop_pp": round(100.0 * (b - c) / len(rows), 4)}
    out["top5_drop_pp"] = round(100.0 * (out["reference_top5"] - out["candidate_top5"]), 4)
    out.update(per_class(ref[:, 0], cand[:, 0], label, name_of))
    claim = top1_claim(b, c, len(rows), limit, confidence)
    text = "{} keeps {:.1f} of FP32's {:.1f} % top-1; {}".format(
        candidate_name, 100.0 * out["candidate_top1"], 100.0 * out["reference_top1"], claim["claim"])
    worst = out["worst_class"]
    if claim["verdict"] != "inconclusive" and worst and worst["candidate_right"] < worst["reference_right"]:
        text += "; worst class {!r}: {} -> {} of {} right".format(
            worst["class"], worst["reference_right"], worst["candidate_right"], worst["images"])
    out.update({k: v for k, v in claim.items() if k not in ("verdict", "claim")},
               top1_verdict=claim["verdict"], top1_claim=text)
    return out


def _fidelity(flipped: np.ndarray, confident: np.ndarray, limit_pct: float, confidence: float) -> Dict[str, Any]:
    """The changed-answer rate among the images FP32 is confident about, with its exact interval and claim."""
    m, k = int(confident.sum()), int((flipped & confident).sum())
    lo, hi = (100.0 * x for x in clopper_pearson(k, m, confidence))
    at = percent(confidence)
    if m and hi <= limit_pct:
        verdict, claim = "pass", "top-1 changes on <= {:.1f} % of confident images at {} ({} of {})".format(
            hi, at, k, m)
    elif m and lo > limit_pct:
        verdict, claim = "fail", "top-1 changes on >= {:.1f} % of confident images at {} ({} of {}), beyond " \
                                 "{:g} %".format(lo, at, k, m, limit_pct)
    else:
        verdict = "inconclusive"
        claim = "cannot tell whether top-1 changes on <= {:g} % of confident images: {} of {} changed ({:.1f}.." \
                "{:.1f} % at {})".format(limit_pct, k, m, lo, hi, at)
    return {"confident_images": m, "confident_flips": k, "confident_flip_interval_pct": [round(lo, 3), round(hi, 3)],
            "fidelity_verdict": verdict, "fidelity_claim": claim}


def _below(value: Optional[float], threshold: float) -> bool:
    return not (value is not None and value >= threshold)  # NaN and None never pass


def _judge(report: Dict[str, Any], t: GateConfig) -> None:
    """failures (any: "fail"), the claims and what keeps them inconclusive, the verdict."""
    failures, inconclusive, claims = [], [], []
    bad = report["non_finite"]
    if bad:
        first = bad[0]
        failures.append("non-finite output: the {} gave {} NaN and {} Inf values on {}{}".format(
            first["model"], first["nan"], first["inf"], first["file"],
            " (+{} more images)".format(len(bad) - 1) if len(bad) > 1 else ""))
    if report["samples"] == 0:
        failures.append("regression set is empty")
    failures += [f for f in (report.get("reference_failure"), report.get("labels_failure"),
                             collapse_failure(report), report.get("strata_failure")) if f]
    failures += ["labels look swapped: " + s for s in report.get("swapped_folders", [])[:3]]
    if report["reference_near_uniform"]:
        failures.append("the FP32 model's outputs are near-uniform (top-1 probability below {:.4f} on 95 % of images):"
                        " untrained weights cannot be judged; declare them with --untrained".format(
                            NEAR_UNIFORM / report["classes"]))
    if "unlabelled_agreement" in report and _below(report["unlabelled_agreement"], t.min_agreement):
        failures.append("top-1 agreement {} < {} on unlabelled images".format(
            _shown(report["unlabelled_agreement"]), t.min_agreement))
    for key, name, threshold in (("mean_cosine", "mean logit cosine", t.min_mean_cosine),
                                 ("p5_cosine", "5th-percentile logit cosine", t.min_p5_cosine)):
        if _below(report[key], threshold):
            failures.append("{} {} < {}".format(name, _shown(report[key]), threshold))
    for prefix in ("top1", "fidelity"):
        verdict = report.get(prefix + "_verdict")
        if verdict is None:
            continue
        claims.append(report[prefix + "_claim"])
        if verdict == "fail":
            failures.append(report[prefix + "_claim"])
        elif verdict == "inconclusive":
            inconclusive.append(report[prefix + "_claim"])
    verdict = "fail" if failures else "inconclusive" if inconclusive else "pass"
    report.update(failures=failures, inconclusive=inconclusive, claims=claims, verdict=verdict,
                  passed=verdict == "pass")


def _outputs(reference: Infer, candidate: Infer, images: CalibrationSet, preprocess: PreprocessConfig,
             ) -> Dict[str, Any]:
    """Both models over every image: top-5s, cosines, FP32 confidence, non-finite outputs."""
    prep = CpuPreprocessor(preprocess)
    rows: Dict[str, List[Any]] = {"ref": [], "cand": [], "cos": [], "conf": [], "bad": [], "scores": []}
    classes = 0
    for name in images.files:
        tensor = prep(images.read(name))
        ref = np.asarray(reference(tensor), np.float32).reshape(-1)
        cand = np.asarray(candidate(tensor), np.float32).reshape(-1)
        classes = ref.size
        rows["bad"].extend(b for b in (_non_finite(name, "reference", ref), _non_finite(name, "candidate", cand)) if b)
        # non-finite values sort last: a NaN never becomes a top-1
        rows["ref"].append(np.argsort(-np.nan_to_num(ref, nan=-np.inf), kind="stable")[:5])
        rows["cand"].append(np.argsort(-np.nan_to_num(cand, nan=-np.inf), kind="stable")[:5])
        rows["cos"].append(_cosine(ref, cand))
        rows["conf"].append(_top_probability(ref))
        rows["scores"].append((ref, cand))
    n = len(images.files)
    return {"n": n, "classes": classes, "bad": rows["bad"], "cos": np.asarray(rows["cos"], np.float64),
            "conf": np.asarray(rows["conf"], np.float64),
            "top5": [np.asarray(rows[k], np.int64).reshape(n, -1) for k in ("ref", "cand")],
            "scores": [np.asarray([pair[i] for pair in rows["scores"]], np.float32).reshape(n, -1) for i in (0, 1)]}


def _margins(scores: List[np.ndarray], i: int, ref: int, cand: int) -> Dict[str, float]:
    """A flip's logit margins: FP32's lead of its answer over the candidate's, and the candidate's the other way."""
    a, b = scores[0][i], scores[1][i]
    return {"reference_margin": round(float(a[ref] - a[cand]), 4),
            "candidate_margin": round(float(b[cand] - b[ref]), 4)}


def _checks(report: Dict[str, Any], out: Dict[str, Any], labels: Optional[Sequence[str]],
            source_info: Dict[str, Any], confidence: float, name_of: Callable[[int], Any]) -> Dict[str, Any]:
    """The reference, labels and per-class checks (edge.model.gate_checks)."""
    found: Dict[str, Any] = {"labels_failure": labels_failure(labels)}
    if out["n"]:
        found.update(collapsed_classes(out["scores"][0], out["scores"][1], out["top5"][0], out["top5"][1], name_of))
    if report.get("labelled"):
        found.update(reference_check(report["reference_right"], report["labelled"], out["classes"], source_info,
                                     report["regression_sha256"], confidence))
    return found


def evaluate(reference: Infer, candidate: Infer, images: CalibrationSet, preprocess: PreprocessConfig,
             thresholds: GateConfig, labels: Optional[Sequence[str]] = None, *, confidence: float = CONFIDENCE,
             source_info: Optional[Dict[str, Any]] = None, candidate_name: str = "INT8") -> GateResult:
    """Run both models over `images` and judge the candidate against `thresholds` (module docstring); every
    interval at `confidence` (a later look at the same set: edge.model.gate_stats.look_confidence); `source_info`:
    the source's model info (its recorded `expected_top1`)."""
    started = time.monotonic()
    truth = resolve_labels(images, labels)
    out = _outputs(reference, candidate, images, preprocess)
    n, ref_top5, cand_top5, cosines = out["n"], out["top5"][0], out["top5"][1], out["cos"]

    def name_of(i: int) -> Any:
        return labels[i] if labels is not None and i < len(labels) else i

    flipped = ref_top5[:, 0] != cand_top5[:, 0] if n else np.zeros(0, bool)
    flips = [dict(_margins(out["scores"], i, int(ref_top5[i, 0]), int(cand_top5[i, 0])), file=images.files[i],
                  reference=name_of(int(ref_top5[i, 0])), candidate=name_of(int(cand_top5[i, 0])),
                  label=None if truth[i] is None else name_of(truth[i]), cosine=round(float(cosines[i]), 5))
             for i in np.flatnonzero(flipped)]
    report: Dict[str, Any] = {
        "samples": n, "labelled": sum(t is not None for t in truth), "regression_set": images.root,
        "regression_sha256": images.sha256, "classes": out["classes"], "confidence": confidence,
        "agreement": round(float(np.mean(~flipped)), 6) if n else None,
        "mean_cosine": round(float(np.mean(cosines)), 6) if n else None,
        "p5_cosine": round(float(np.percentile(cosines, 5)), 6) if n else None,
        "min_cosine": round(float(np.min(cosines)), 6) if n else None,
        "reference_near_uniform": bool(n and out["classes"] > 1 and np.percentile(out["conf"], 95)
                                       < NEAR_UNIFORM / out["classes"]),
        "non_finite": out["bad"][:MAX_FLIPS_LISTED],
        "thresholds": {k: getattr(thresholds, k) for k in vars(thresholds)},
        "flips": flips[:MAX_FLIPS_LISTED], "flips_not_listed": max(0, len(flips) - MAX_FLIPS_LISTED),
    }
    unlabelled = [i for i, t in enumerate(truth) if t is None]
    if unlabelled:  # labelled images are judged by the accuracy drop: a wrong answer turning into another is no loss
        report["unlabelled_agreement"] = round(float(np.mean(~flipped[unlabelled])), 6)
    report.update(_fidelity(flipped, out["conf"] >= CONFIDENT, thresholds.max_confident_flip_pct, confidence))
    report.update(_accuracy(ref_top5, cand_top5, truth, thresholds.max_top1_drop_pp, confidence, name_of,
                            candidate_name))
    report.update(_checks(report, out, labels, source_info or {}, confidence, name_of))
    report.update(by_stratum(stratum_names(images, preprocess.resize), ref_top5[:, 0], cand_top5[:, 0], truth,
                             limit=thresholds.max_top1_drop_pp, confidence=confidence, resize=preprocess.resize))
    if report.get("strata_claim") and "top1_claim" in report:  # the claim names the images it rests on
        report["top1_claim"] += "; " + report["strata_claim"]
    _judge(report, thresholds)
    report["seconds"] = round(time.monotonic() - started, 2)
    return GateResult(report)


KERNEL_IMAGES = 32  # regression images the fused-kernel comparison runs on


def kernel_distance(judged: Infer, fused: Infer, images: CalibrationSet,
                    preprocess: PreprocessConfig) -> Dict[str, Any]:
    """How far this CPU's fused ONNX Runtime int8 kernels (what `edge run` serves where they do not saturate) are
    from the arithmetic the gate judged, on the first KERNEL_IMAGES images: top-1 agreement and the largest logit
    difference relative to the largest judged logit."""
    prep = CpuPreprocessor(preprocess)
    same, worst = 0, 0.0
    names = images.files[:KERNEL_IMAGES]
    for name in names:
        tensor = prep(images.read(name))
        a = np.asarray(judged(tensor), np.float64).reshape(-1)
        b = np.asarray(fused(tensor), np.float64).reshape(-1)
        same += int(np.argmax(a) == np.argmax(b))
        scale = float(np.max(np.abs(a))) or 1.0
        difference = float(np.max(np.abs(a - b))) / scale
        worst = max(worst, difference if np.isfinite(difference) else math.inf)
    return {"images": len(names), "top1_agreement": round(same / max(len(names), 1), 4),
            "max_relative_difference": round(worst, 6) if math.isfinite(worst) else None}


def _json_safe(value: Any) -> Any:
    """The report as strict JSON: a non-finite float (never expected, but a NaN must not make it unreadable) is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_report(path: str, result: GateResult, extra: Optional[Dict[str, Any]] = None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomic(path, _json_safe(dict(result.report, **(extra or {}))))


def enforce(result: GateResult, report_path: str, accept_inconclusive: bool = False) -> None:
    """A failed gate is a failed build (exit 1), with the first reason and where the full report is; so is an
    inconclusive one unless `accept_inconclusive`."""
    if result.report["verdict"] == "fail":
        raise EdgeError("accuracy gate failed: {} ({}; report: {})".format(
            "; ".join(result.failures), result.summary(), report_path), exit_code=EXIT_FAIL)
    if result.report["verdict"] == "inconclusive" and not accept_inconclusive:
        raise EdgeError(inconclusive_line(result.report, report_path), exit_code=EXIT_FAIL)


def inconclusive_line(r: Dict[str, Any], report_path: str) -> str:
    """The refusal of an inconclusive verdict: what cannot be told and the override, in one uncut line."""
    at, limits = percent(r.get("confidence", CONFIDENCE)), r.get("thresholds", {})
    parts = []
    if r.get("top1_verdict") == "inconclusive":
        lo, hi = r["top1_drop_interval_pp"]
        parts.append("top-1 drop {:+.2f}..{:+.2f} pp at {} vs the {:g} pp limit; ~{} labelled images decide it".format(
            lo, hi, at, limits.get("max_top1_drop_pp", 0), r.get("labels_needed", "more")))
    if r.get("fidelity_verdict") == "inconclusive":
        lo, hi = r["confident_flip_interval_pct"]
        parts.append("{} of {} confident images flipped ({:.1f}..{:.1f} % at {}) vs the {:g} % limit".format(
            r["confident_flips"], r["confident_images"], lo, hi, at, limits.get("max_confident_flip_pct", 0)))
    head = "accuracy gate inconclusive, nothing installed (--accept-inconclusive installs it anyway): "
    tail = " (report: {})".format(report_path)
    while len(parts) > 1 and len(head + "; ".join(parts) + tail) > MAX_LINE_CHARS:
        parts.pop()
    return head + "; ".join(parts or ["see the report"]) + tail
