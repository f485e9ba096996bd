"""`build.method: auto` (the default): calibrate with every method the quantizer has on one part of the calibration
set, keep the method whose logits stay closest to FP32's on the held-out part (edge.model.fidelity.split), and
calibrate with it on the whole set.

No one method suits every network (docs/build.md, measured on trained ImageNet models): entropy calibration is far
better than minmax on MobileNetV2 and far worse on EfficientNet-Lite0; each method's damage on calibration images
ranks them as the regression set does.
"""

import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

from edge.config import PreprocessConfig
from edge.errors import EdgeError, first_line, require
from edge.model.calibration import CalibrationSet
from edge.model.fidelity import HELD_OUT, Fidelity, split
from edge.model.quantize import kept_in_float, quantize_qdq
from edge.store.fileio import temp_dir

AUTO = "auto"
CANDIDATES = {"onnxruntime": ("minmax", "percentile", "entropy"), "modelopt": ("minmax", "entropy")}


def quantize(fp32_path: str, out_path: str, images: CalibrationSet, preprocess: PreprocessConfig, method: str,
             exclude_sensitive: bool = True, show_progress: bool = True, log: Callable[..., None] = print,
             quantizer: str = "onnxruntime", tensorrt: Optional[str] = None) -> Dict[str, Any]:
    """edge.model.quantize.quantize_qdq with `method`, or with each candidate method when it is "auto"."""
    if method != AUTO:
        return quantize_qdq(fp32_path, out_path, images, preprocess, method, exclude_sensitive, show_progress, log,
                            quantizer, tensorrt)
    started = time.monotonic()
    calibrate_on, held_out = split(images)
    fidelity = Fidelity(fp32_path, held_out, preprocess)
    tried: Dict[str, Dict[str, Any]] = {}
    best: Optional[Tuple[float, str]] = None
    errors = []
    with temp_dir(os.path.dirname(os.path.abspath(out_path)), ".auto-") as work:
        for candidate in CANDIDATES[quantizer]:
            path = os.path.join(work, candidate + ".onnx")
            try:
                summary = quantize_qdq(fp32_path, path, calibrate_on, preprocess, candidate, exclude_sensitive,
                                       show_progress, lambda *a: None, quantizer, tensorrt)
            except EdgeError as exc:  # e.g. percentile's "Too many bins" on random weights
                errors.append(exc)
                tried[candidate] = {"error": first_line(exc).replace(fp32_path, os.path.basename(fp32_path))}
                continue
            damage = fidelity.damage(require("onnx").load(path))
            tried[candidate] = {"damage": round(damage, 6), "seconds": summary["seconds"]}
            if best is None or damage < best[0]:
                best = (damage, candidate)
        if best is None:
            raise errors[0]
    summary = quantize_qdq(fp32_path, out_path, images, preprocess, best[1], exclude_sensitive, show_progress,
                           lambda *a: None, quantizer, tensorrt)
    summary.update(chosen_by=AUTO, candidates=tried, seconds=round(time.monotonic() - started, 2),
                   chosen_on={"calibrated_on": len(calibrate_on), "held_out": len(held_out)})
    log("quantize: {} -> {} ({} auto: {}; damage (1 - logit cosine) on {} held-out calibration images, each method "
        "calibrated on the other {}: {}; then calibrated on all {}; {}, {} Q/DQ nodes) in "
        "{:.1f} s{}".format(
            os.path.basename(fp32_path), out_path, quantizer, summary["method"], len(held_out), len(calibrate_on),
            ", ".join("{} {}".format(m, r["damage"] if "damage" in r else "failed") for m, r in tried.items()),
            len(images), kept_in_float(summary["excluded_nodes"]), summary["qdq_nodes"], summary["seconds"],
            "" if len(held_out) >= HELD_OUT else "; fewer than {} held out: a larger calibration set makes the "
            "choice surer".format(HELD_OUT)))
    return summary
