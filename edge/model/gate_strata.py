"""The judged images by kind: a claim rests on its images, and 500 upscaled 64-px thumbnails are not the 20 photos
beside them.

Strata come from the set's manifest, which records each image's size: UPSCALED (short side below the
preprocessing's resize: the model sees interpolated pixels) and FULL. Per stratum: images, labelled images, changed
answers, both models' top-1, the changed answers each way and the drop with its interval. The claim names the
images it rests on. The verdict stays the one judged on the whole set (no extra look is spent, a stratum never
makes a pass); a stratum only adds a failure: when its drop's lower bound, at the look's confidence split over the
strata (Bonferroni: a sound model fails on some stratum no more often than the overall claim allows), is beyond
the limit, the damage is shown on that kind of image alone and the build fails naming it.
"""

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from edge.model.calibration import CalibrationSet
from edge.model.gate_stats import paired_drop_interval, percent, z_of

UPSCALED, FULL = "upscaled", "full size"


def stratum_names(images: CalibrationSet, resize: int) -> Optional[List[str]]:
    """Each image's stratum, from the sizes the manifest records; None when it records none."""
    sizes = {str(e.get("name")): (e.get("width"), e.get("height")) for e in images.manifest.get("files", [])
             if isinstance(e, dict)}
    out = []
    for name in images.files:
        width, height = sizes.get(name, (None, None))
        if not (isinstance(width, int) and isinstance(height, int)):
            return None
        out.append(UPSCALED if min(width, height) < resize else FULL)
    return out


def _row(name: str, rows: List[int], ref_top1: np.ndarray, cand_top1: np.ndarray, truth: Sequence[Optional[int]],
         *, limit: float, z: float) -> Dict[str, Any]:
    labelled = [i for i in rows if truth[i] is not None]
    row: Dict[str, Any] = {"stratum": name, "images": len(rows), "labelled": len(labelled),
                           "changed_top1": int((ref_top1[rows] != cand_top1[rows]).sum())}
    if labelled:
        label = np.asarray([truth[i] for i in labelled])
        ref_right, cand_right = ref_top1[labelled] == label, cand_top1[labelled] == label
        b, c = int((ref_right & ~cand_right).sum()), int((~ref_right & cand_right).sum())
        lo, hi = (round(100.0 * x, 4) for x in paired_drop_interval(b, c, len(labelled), z))
        row.update(reference_top1=round(float(ref_right.mean()), 6), candidate_top1=round(float(cand_right.mean()), 6),
                   right_to_wrong=b, wrong_to_right=c, top1_drop_pp=round(100.0 * (b - c) / len(labelled), 4),
                   top1_drop_interval_pp=[lo, hi], beyond_limit=lo > limit)
    return row


def by_stratum(strata: Optional[List[str]], ref_top1: np.ndarray, cand_top1: np.ndarray,
               truth: Sequence[Optional[int]], *, limit: float, confidence: float, resize: int) -> Dict[str, Any]:
    """The per-stratum table, the words the top-1 claim adds and a stratum's failure; {} with one stratum."""
    names = sorted(set(strata or []))
    if len(names) < 2:
        return {}
    split = 1.0 - (1.0 - confidence) / len(names)
    rows = [_row(name, [i for i, s in enumerate(strata or []) if s == name], ref_top1, cand_top1, truth,
                 limit=limit, z=z_of(split)) for name in names]
    words = ", ".join("{} {} images (FP32 {:.1f} %; {} turned wrong, {} right)".format(
        r["labelled"], r["stratum"], 100.0 * r["reference_top1"], r["right_to_wrong"], r["wrong_to_right"])
        for r in rows if r["labelled"])
    out: Dict[str, Any] = {"strata": rows, "strata_confidence": round(split, 6), "strata_note":
                           "{}: short side below the {} px resize".format(UPSCALED, resize)}
    if words:
        out["strata_claim"] = "rests on " + words
    bad = [r for r in rows if r.get("beyond_limit")]
    if bad:
        out["strata_failure"] = "; ".join(
            "on the {} {} images alone the top-1 drop is >= {:.2f} pp at {} (strata judged apart), beyond the {:g} pp "
            "limit".format(r["labelled"], r["stratum"], r["top1_drop_interval_pp"][0], percent(split), limit)
            for r in bad)
    return out
