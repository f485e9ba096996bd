"""`build.method: auto` (the default): calibrate with every method the quantizer has and keep the Q/DQ model whose
logits stay closest to FP32's on calibration images (edge.build.fidelity).

No one method suits every network (docs/build.md, measured on trained ImageNet models): entropy calibration is far
better than minmax on MobileNetV2 and far worse on EfficientNet-Lite0; each method's damage on calibration images
ranks them as the regression set does.
"""

import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

from edge.build.calibration import CalibrationSet
from edge.build.fidelity import IMAGES, Fidelity
from edge.build.quantize import quantize_qdq
from edge.config import PreprocessConfig
from edge.errors import EdgeError, first_line, require
from edge.fileio import temp_dir

AUTO = "auto"
CANDIDATES = {"onnxruntime": ("minmax", "percentile", "entropy"), "modelopt": ("minmax", "entropy")}


def quantize(fp32_path: str, out_path: str, images: CalibrationSet, preprocess: PreprocessConfig, method: str,
             exclude_sensitive: bool = True, show_progress: bool = True, log: Callable[..., None] = print,
             quantizer: str = "onnxruntime", tensorrt: Optional[str] = None) -> Dict[str, Any]:
    """edge.build.quantize.quantize_qdq with `method`, or with each candidate method when it is "auto"."""
    if method != AUTO:
        return quantize_qdq(fp32_path, out_path, images, preprocess, method, exclude_sensitive, show_progress, log,
                            quantizer, tensorrt)
    started = time.monotonic()
    fidelity = Fidelity(fp32_path, images, preprocess)
    tried: Dict[str, Dict[str, Any]] = {}
    best: Optional[Tuple[float, Dict[str, Any]]] = None
    errors = []
    with temp_dir(os.path.dirname(os.path.abspath(out_path)), ".auto-") as work:
        for candidate in CANDIDATES[quantizer]:
            path = os.path.join(work, candidate + ".onnx")
            try:
                summary = quantize_qdq(fp32_path, path, images, preprocess, candidate, exclude_sensitive,
                                       show_progress, lambda *a: None, quantizer, tensorrt)
            except EdgeError as exc:  # e.g. percentile's "Too many bins" on random weights
                errors.append(exc)
                tried[candidate] = {"error": first_line(exc).replace(fp32_path, os.path.basename(fp32_path))}
                continue
            damage = fidelity.damage(require("onnx").load(path))
            tried[candidate] = {"damage": round(damage, 6), "seconds": summary["seconds"]}
            if best is None or damage < best[0]:
                best = (damage, summary)
                os.replace(path, os.path.join(work, "best.onnx"))
        if best is None:
            raise errors[0]
        os.replace(os.path.join(work, "best.onnx"), out_path)
    summary = dict(best[1], chosen_by=AUTO, candidates=tried, seconds=round(time.monotonic() - started, 2))
    log("quantize: {} -> {} ({} auto: {}; damage (1 - logit cosine, {} calibration images) {}; {} nodes kept in "
        "float, {} Q/DQ nodes) in {:.1f} s".format(
            os.path.basename(fp32_path), out_path, quantizer, summary["method"], min(len(images), IMAGES),
            ", ".join("{} {}".format(m, r["damage"] if "damage" in r else "failed") for m, r in tried.items()),
            len(summary["excluded_nodes"]), summary["qdq_nodes"], summary["seconds"]))
    return summary
