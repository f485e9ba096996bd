"""How far a Q/DQ model's logits are from FP32's, run as TensorRT computes it (edge.infer.qdq_emulation), on the
held-out split of the calibration set — images the candidate's ranges were not computed from in a method choice,
and never the regression set the gate judges with. The build uses it to choose a calibration method
(edge.model.auto_method, `build.method: auto`) and to choose the layers to leave in float (edge.model.fallback),
so that the regression set is looked at once, by the gate.
"""

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from edge.config import GateConfig, PreprocessConfig
from edge.errors import require
from edge.infer.onnxruntime_backend import OFFLINE_THREADS, session_options
from edge.infer.preprocess import CpuPreprocessor
from edge.infer.qdq_emulation import emulated_model
from edge.model.calibration import CalibrationSet

HELD_OUT = 64  # images held out of calibration for the choices, where the set has twice as many


def split(images: CalibrationSet) -> Tuple[CalibrationSet, CalibrationSet]:
    """(images to calibrate on, held-out images): every k-th image held out, HELD_OUT of them when the set has at
    least twice as many, half of a smaller set, a quarter of a large one."""
    count = max(min(HELD_OUT, len(images) // 2), len(images) // 4, 1)
    step = len(images) / count
    held = {images.files[int(i * step)] for i in range(count)}

    def subset(files: List[str]) -> CalibrationSet:
        return CalibrationSet(images.root, files, images.sha256, images.manifest)

    return subset([f for f in images.files if f not in held] or images.files), subset(sorted(held))


class Fidelity:
    """FP32's logits on every image of `images` (a held-out split), and `damage(model)`: how far a candidate's are."""

    def __init__(self, fp32_path: str, images: CalibrationSet, preprocess: PreprocessConfig):
        self.ort = require("onnxruntime")
        prep = CpuPreprocessor(preprocess)
        self.images = len(images)
        self.tensors = [prep(images.read(name)).copy() for name in images.files]
        self.reference = self._logits(require("onnx").load(fp32_path))

    def _session(self, model: Any) -> Any:
        options = session_options(self.ort, OFFLINE_THREADS, False)  # as edge.model.plan.onnx_runner
        return self.ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def _logits(self, model: Any) -> np.ndarray:
        return self._run(self._session(model), {})

    def _run(self, session: Any, extra: Dict[str, np.ndarray]) -> np.ndarray:
        name = session.get_inputs()[0].name
        return np.concatenate([session.run(None, dict(extra, **{name: t}))[0].reshape(1, -1) for t in self.tensors])

    def _cosines(self, logits: np.ndarray) -> np.ndarray:
        logits, ref = logits.astype(np.float64), self.reference.astype(np.float64)
        norms = np.linalg.norm(logits, axis=1) * np.linalg.norm(ref, axis=1)
        cosine = np.sum(logits * ref, axis=1) / np.where(norms > 0, norms, 1.0)
        return np.where(np.isfinite(cosine), cosine, -1.0)  # a non-finite output is the worst, never NaN

    def _damage(self, logits: np.ndarray) -> float:
        return float(np.mean(1.0 - self._cosines(logits)))

    def logits(self, model: Any) -> np.ndarray:
        """`model`'s logits (Q/DQ emulated) on the held-out images."""
        return self._logits(emulated_model(model))

    def damage(self, model: Any) -> float:
        """Mean 1 - cosine of `model`'s logits (Q/DQ emulated) against FP32's."""
        return self._damage(self.logits(model))

    def damages(self, emulated: Any, feeds: Sequence[Dict[str, np.ndarray]]) -> List[float]:
        """damage() of one already emulated model run once per extra input in `feeds` (one session for all)."""
        session = self._session(emulated)
        return [self._damage(self._run(session, extra)) for extra in feeds]

    def verdict(self, model: Any, thresholds: GateConfig) -> Dict[str, Any]:
        """The gate's cosine thresholds on the held-out images: {"passed", "mean_cosine", "p5_cosine", "images"}."""
        cosines = self._cosines(self.logits(model))
        mean, p5 = float(np.mean(cosines)), float(np.percentile(cosines, 5))
        return {"passed": bool(mean >= thresholds.min_mean_cosine and p5 >= thresholds.min_p5_cosine),
                "mean_cosine": round(mean, 6), "p5_cosine": round(p5, 6), "images": self.images}
