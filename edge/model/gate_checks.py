"""What the gate checks besides the candidate's drop: the FP32 reference itself, the labels, and every class.

- The reference: FP32 top-1 on the labelled images must not sit below the figure its model info records
  (`expected_top1`, measured on `expected_top1_set` when it names one) beyond its own Clopper-Pearson interval, nor,
  with no figure recorded, below CHANCE_MULTIPLE x chance (1 / classes; with under 10 classes, halfway from chance
  to 100 %): a model at chance, a labels file in another
  order or the wrong preprocessing is refused before INT8 is judged against it.
- The labels: a labels file holding ImageNet's 1000 class names in another order (the pinned torchvision list), and
  a class folder FP32 files under one other class (at least MIN_CLASS_IMAGES images, none right, SWAPPED_SHARE on
  that one).
- Every class, label-free on every image: the spread of its score over the set (99th percentile minus median, each
  image's scores centred) in the candidate against FP32's, and how often the class leaves the candidate's top-5
  where FP32 ranks it first. A collapsed class (a classifier row scaled to nothing) fails, named; per-class recall
  deltas where labels exist.
"""

import hashlib
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from edge.model.gate_stats import clopper_pearson, percent

CHANCE_MULTIPLE = 5  # with no recorded figure, FP32 top-1 must be able to reach 5x chance (digits: 50 %; 1000: 0.5 %)
# a class folder of at least MIN_CLASS_IMAGES that FP32 gets none of and files SWAPPED_SHARE of under one other class
# has the wrong label (sound MobileNetV2 calls 3 of 5 thumbnails of 'police van' 'moving van': not evidence)
MIN_CLASS_IMAGES = 10
SWAPPED_SHARE = 0.8
COLLAPSED_SPREAD = 0.25  # the candidate's score spread below a quarter of FP32's: the class collapsed
COLLAPSED_LOST = 0.5  # ... or it leaves the top-5 on half the images (at least MIN_LED) FP32 ranks it first
MIN_LED = 3
# torchvision's ImageNet-1k class names, '\n'-joined: in order, and sorted (the same names in any order)
IMAGENET_NAMES_SHA256 = "0b0f9fee7c952f257418d62aa701f023a9da13b443a14f5c4291e5724d92967c"
IMAGENET_SORTED_SHA256 = "1a8120173a37acd9fcdad982260063026c8f644c194945c1f82883c32ad5b3b8"


def _sha(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def reference_check(right: int, labelled: int, classes: int, info: Dict[str, Any], set_sha256: str,
                    confidence: float) -> Dict[str, Any]:
    """FP32's top-1 against its recorded figure (or CHANCE_MULTIPLE x chance): `reference_failure` when even its
    upper bound at `confidence` is below it."""
    lo, hi = clopper_pearson(right, labelled, confidence)
    expected, measured_on = info.get("expected_top1"), info.get("expected_top1_set")
    if isinstance(expected, (int, float)) and 0 < expected <= 1 and measured_on in (None, set_sha256):
        floor, basis = float(expected), "the {:.1f} % its model info records".format(100.0 * expected)
    else:
        chance = 1.0 / max(classes, 1)
        floor = min(CHANCE_MULTIPLE * chance, (1.0 + chance) / 2)  # a few classes: halfway from chance to all right
        basis = "{:.1f} % ({}x chance, at most halfway to 100 %; record the model's own figure with: edge model add " \
                "--expected-top1)".format(100.0 * floor, CHANCE_MULTIPLE)
    out: Dict[str, Any] = {"reference_top1_interval": [round(lo, 6), round(hi, 6)], "reference_floor": floor}
    if hi < floor:
        out["reference_failure"] = (
            "FP32 reference top-1 {:.1f} % ({} of {}; <= {:.1f} % at {}) is below {}: wrong labels, preprocessing or "
            "weights; INT8 cannot be judged against it".format(100.0 * right / labelled, right, labelled, 100.0 * hi,
                                                               percent(confidence), basis))
    return out


def labels_failure(labels: Optional[Sequence[str]]) -> Optional[str]:
    """ImageNet's class names in another order than the pinned list: every index names the wrong class."""
    if labels is None or len(labels) != 1000 or _sha(labels) == IMAGENET_NAMES_SHA256:
        return None
    if _sha(sorted(labels)) == IMAGENET_SORTED_SHA256:
        return "the labels file holds ImageNet's class names in another order (line 1 says {!r}, ImageNet's class 0 " \
               "is 'tench'): every index would name another class".format(labels[0])
    return None


def per_class(ref_top1: np.ndarray, cand_top1: np.ndarray, truth: np.ndarray,
              name_of: Callable[[int], Any]) -> Dict[str, Any]:
    """Per labelled class: images, FP32 and candidate right; the worst class (largest loss of right answers) and
    the folders FP32 files under one other class (swapped labels)."""
    rows, swapped = [], []
    for label in np.unique(truth):
        mine = truth == label
        n, ref_right, cand_right = int(mine.sum()), int((ref_top1[mine] == label).sum()), \
            int((cand_top1[mine] == label).sum())
        rows.append({"class": name_of(int(label)), "images": n, "reference_right": ref_right,
                     "candidate_right": cand_right})
        if n >= MIN_CLASS_IMAGES and ref_right == 0:
            other, count = np.unique(ref_top1[mine], return_counts=True)
            if count.max() >= SWAPPED_SHARE * n:
                swapped.append("folder of class {!r}: FP32 calls {} of its {} images {!r}".format(
                    name_of(int(label)), int(count.max()), n, name_of(int(other[np.argmax(count)]))))
    rows.sort(key=lambda r: ((r["candidate_right"] - r["reference_right"]) / r["images"], -r["images"]))
    return {"per_class": rows, "worst_class": rows[0] if rows else None, "swapped_folders": swapped}


def collapsed_classes(ref: np.ndarray, cand: np.ndarray, ref_top5: np.ndarray, cand_top5: np.ndarray,
                      name_of: Callable[[int], Any]) -> Dict[str, Any]:
    """Label-free, on every image (`ref`, `cand`: images x classes scores)."""
    ref, cand = (np.nan_to_num(x.astype(np.float64)) for x in (ref, cand))
    ref, cand = ref - ref.mean(axis=1, keepdims=True), cand - cand.mean(axis=1, keepdims=True)  # per-image shift
    spread_ref = np.percentile(ref, 99, axis=0) - np.median(ref, axis=0)
    spread_cand = np.percentile(cand, 99, axis=0) - np.median(cand, axis=0)
    judged = spread_ref > 0.05 * max(float(np.median(spread_ref)), 1e-12)  # a class FP32 moves at all
    ratio = np.where(judged, spread_cand / np.where(judged, spread_ref, 1.0), 1.0)
    first = ref_top5[:, 0]
    kept = (cand_top5 == first[:, None]).any(axis=1)
    led = np.bincount(first, minlength=ref.shape[1])
    lost = np.bincount(first[~kept], minlength=ref.shape[1])
    bad = (ratio < COLLAPSED_SPREAD) | ((led >= MIN_LED) & (lost >= COLLAPSED_LOST * np.maximum(led, 1)))
    listed = [{"class": name_of(int(j)), "spread_ratio": round(float(ratio[j]), 4), "ranked_first": int(led[j]),
               "left_top5": int(lost[j])} for j in np.flatnonzero(bad)]
    return {"collapsed_classes": listed, "min_spread_ratio": round(float(ratio.min()), 4) if ratio.size else None}


def collapse_failure(report: Dict[str, Any]) -> Optional[str]:
    listed: List[Dict[str, Any]] = report.get("collapsed_classes") or []
    if not listed:
        return None
    names = ", ".join("{!r} (score spread x{:.3f}, out of the top-5 on {} of the {} images FP32 ranks it first)".format(
        c["class"], c["spread_ratio"], c["left_top5"], c["ranked_first"]) for c in listed[:3])
    return "{} class{} collapsed in the candidate: {}{}".format(
        len(listed), "" if len(listed) == 1 else "es", names, " and {} more".format(len(listed) - 3)
        if len(listed) > 3 else "")
