"""How far a Q/DQ model's logits are from FP32's, run as TensorRT computes it (edge.frame.qdq_emulation), on a few
calibration images — never the regression set the gate judges with. The build uses it to choose a calibration
method (edge.build.auto_method, `build.method: auto`) and to rank the layers to leave in float (edge.build.fallback).
"""

from typing import Any, Dict, List, Sequence

import numpy as np

from edge.build.calibration import CalibrationSet
from edge.config import PreprocessConfig
from edge.errors import require
from edge.frame.onnxruntime_backend import OFFLINE_THREADS, session_options
from edge.frame.preprocess import CpuPreprocessor
from edge.frame.qdq_emulation import emulated_model

IMAGES = 16  # spread evenly over the calibration set


class Fidelity:
    """FP32's logits on IMAGES calibration images, and `damage(model)`: how far a candidate's are from them."""

    def __init__(self, fp32_path: str, images: CalibrationSet, preprocess: PreprocessConfig):
        self.ort = require("onnxruntime")
        prep = CpuPreprocessor(preprocess)
        step = max(1, len(images) // IMAGES)
        self.tensors = [prep(images.read(name)).copy() for name in images.files[::step][:IMAGES]]
        self.reference = self._logits(require("onnx").load(fp32_path))

    def _session(self, model: Any) -> Any:
        options = session_options(self.ort, OFFLINE_THREADS, False)  # as edge.build.plan.onnx_runner
        return self.ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def _logits(self, model: Any) -> np.ndarray:
        return self._run(self._session(model), {})

    def _run(self, session: Any, extra: Dict[str, np.ndarray]) -> np.ndarray:
        name = session.get_inputs()[0].name
        return np.concatenate([session.run(None, dict(extra, **{name: t}))[0].reshape(1, -1) for t in self.tensors])

    def _damage(self, logits: np.ndarray) -> float:
        logits, ref = logits.astype(np.float64), self.reference.astype(np.float64)
        norms = np.linalg.norm(logits, axis=1) * np.linalg.norm(ref, axis=1)
        cosine = np.sum(logits * ref, axis=1) / np.where(norms > 0, norms, 1.0)
        return float(np.mean(1.0 - cosine))

    def damage(self, model: Any) -> float:
        """Mean 1 - cosine of `model`'s logits (Q/DQ emulated) against FP32's."""
        return self._damage(self._logits(emulated_model(model)))

    def damages(self, emulated: Any, feeds: Sequence[Dict[str, np.ndarray]]) -> List[float]:
        """damage() of one already emulated model run once per extra input in `feeds` (one session for all)."""
        session = self._session(emulated)
        return [self._damage(self._run(session, extra)) for extra in feeds]
