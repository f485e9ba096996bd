"""Float fallback for the layers INT8 breaks: find them, leave them unquantised, judge again.

Sensitivity of a layer: how much of the INT8 model's damage (mean 1 - cosine of its logits against FP32's, run
as TensorRT computes it: edge.frame.qdq_emulation) leaving that one layer in float recovers, on calibration
images — never the regression set the gate judges with. The search removes the Q/DQ pairs in front of
the 1, 2, 4, ... most sensitive layers (the scales of every other tensor stay as calibrated, so this is the
model `nodes_to_exclude` would have given) until the gate passes or `limit` layers are float. TensorRT builds
layers without Q/DQ in FP16 (edge.build.tensorrt_engine sets the flag next to INT8).
"""

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edge.build.calibration import CalibrationSet
from edge.config import PreprocessConfig
from edge.errors import require
from edge.frame.preprocess import CpuPreprocessor
from edge.frame.qdq_emulation import emulated_model

SENSITIVITY_IMAGES = 16
FP16_TIME_PER_INT8 = 2.0  # Orin's dense FP16 tensor-core rate is half its INT8 rate (on paper)
_COMPUTE = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def quantized_inputs(model: Any) -> Dict[str, List[Tuple[Any, Any]]]:
    """Consumer node name -> the (QuantizeLinear, DequantizeLinear) pairs feeding it."""
    producers = {out: node for node in model.graph.node for out in node.output}
    pairs: Dict[str, List[Tuple[Any, Any]]] = {}
    for node in model.graph.node:
        for name in node.input:
            dq = producers.get(name)
            if dq is not None and dq.op_type == "DequantizeLinear":
                q = producers.get(dq.input[0])
                if q is not None and q.op_type == "QuantizeLinear":
                    pairs.setdefault(node.name, []).append((q, dq))
    return pairs


def without_quantization(model: Any, nodes: Sequence[str]) -> Any:
    """A copy of `model` whose `nodes` read their float inputs directly (their Q/DQ pairs removed)."""
    onnx = require("onnx")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    rewire = {dq.output[0]: q.input[0] for name, pairs in quantized_inputs(model).items() if name in set(nodes)
              for q, dq in pairs}
    for node in model.graph.node:
        if node.name in set(nodes):
            for i, name in enumerate(node.input):
                node.input[i] = rewire.get(name, name)
    read = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    for _ in range(2):  # the DequantizeLinear nodes nothing reads, then their QuantizeLinear nodes
        keep = [n for n in model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
                or n.output[0] in read]
        del model.graph.node[:]
        model.graph.node.extend(keep)
        read = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    used = read | {n.output[0] for n in model.graph.node}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


class _Scorer:
    """Logits of a candidate model against FP32's on a few preprocessed calibration images."""

    def __init__(self, fp32_path: str, images: CalibrationSet, preprocess: PreprocessConfig):
        self.ort = require("onnxruntime")
        prep = CpuPreprocessor(preprocess)
        step = max(1, len(images) // SENSITIVITY_IMAGES)
        self.tensors = [prep(images.read(name)).copy() for name in images.files[::step][:SENSITIVITY_IMAGES]]
        self.reference = self._logits(require("onnx").load(fp32_path))

    def _logits(self, model: Any) -> np.ndarray:
        options = self.ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as edge.build.plan.onnx_runner
        session = self.ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return np.concatenate([session.run(None, {name: t})[0].reshape(1, -1) for t in self.tensors])

    def damage(self, model: Any) -> float:
        """Mean 1 - cosine of `model`'s logits (Q/DQ emulated) against FP32's."""
        logits = self._logits(emulated_model(model)).astype(np.float64)
        ref = self.reference.astype(np.float64)
        norms = np.linalg.norm(logits, axis=1) * np.linalg.norm(ref, axis=1)
        cosine = np.sum(logits * ref, axis=1) / np.where(norms > 0, norms, 1.0)
        return float(np.mean(1.0 - cosine))


def rank_layers(fp32_path: str, qdq: Any, images: CalibrationSet, preprocess: PreprocessConfig) -> List[Dict[str, Any]]:
    """Every quantised compute layer with what leaving it alone in float recovers, most first."""
    scorer = _Scorer(fp32_path, images, preprocess)
    pairs = quantized_inputs(qdq)
    everything = scorer.damage(qdq)
    ranked = []
    for node in qdq.graph.node:
        if node.op_type in _COMPUTE and node.name and node.name in pairs:  # an unnamed node cannot be singled out
            recovered = everything - scorer.damage(without_quantization(qdq, [node.name]))
            ranked.append({"node": node.name, "recovers": round(recovered, 6)})
    return sorted(ranked, key=lambda r: -r["recovers"])


def compute_share(fp32_path: str, nodes: Sequence[str]) -> float:
    """The fraction of the model's multiply-accumulates done by `nodes` (shapes from ONNX shape inference)."""
    onnx = require("onnx")
    model = onnx.shape_inference.infer_shapes(onnx.load(fp32_path))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(model.graph.value_info) + list(model.graph.output)}
    weights = {i.name: list(i.dims) for i in model.graph.initializer}
    macs: Dict[str, float] = {}
    for node in model.graph.node:
        if node.op_type in _COMPUTE and len(node.input) > 1 and node.input[1] in weights:
            out = shapes.get(node.output[0], [])
            w = weights[node.input[1]]
            per_output = float(np.prod(w[1:])) if node.op_type.startswith("Conv") else float(w[0])
            macs[node.name] = float(np.prod(out or [0])) * per_output
    total = sum(macs.values())
    return sum(macs.get(n, 0.0) for n in nodes) / total if total else 0.0


def expected_cost(fp32_path: str, nodes: Sequence[str]) -> Dict[str, Any]:
    """On paper, until a device measures it: float layers run at FP16, FP16_TIME_PER_INT8 x their INT8 time."""
    share = compute_share(fp32_path, nodes)
    return {"float_share_of_macs": round(share, 4),
            "expected_engine_time_increase_pct": round(100.0 * share * (FP16_TIME_PER_INT8 - 1.0), 1),
            "basis": "compute-bound layers, FP16 at 1/{:g} of INT8 throughput (Orin tensor cores); "
                     "not measured on a device".format(FP16_TIME_PER_INT8)}


Judge = Callable[[str], Any]  # staged Q/DQ path -> GateResult


def search(fp32_path: str, qdq_path: str, images: CalibrationSet, preprocess: PreprocessConfig, limit: int,
           judge: Judge, stage: Callable[[str], str], log: Callable[..., None]) -> Tuple[Optional[str], Any,
                                                                                        List[Dict[str, Any]]]:
    """Leave the most damaging layers in float until `judge` passes: (passing model path or None, last
    GateResult, the float layers with their damage)."""
    onnx = require("onnx")
    qdq = onnx.load(qdq_path)
    ranked = rank_layers(fp32_path, qdq, images, preprocess)
    log("fallback: ranked {} quantised layers on {} calibration images; worst: {}".format(
        len(ranked), min(len(images), SENSITIVITY_IMAGES),
        ", ".join("{} ({:+.4f})".format(r["node"], r["recovers"]) for r in ranked[:3])))
    count, result, chosen = 1, None, []
    while count <= min(limit, len(ranked)):
        chosen = ranked[:count]
        path = stage(os.path.splitext(qdq_path)[0] + ".float{}.onnx".format(count))
        onnx.save(without_quantization(qdq, [r["node"] for r in chosen]), path)
        result = judge(path)
        log("fallback: {} layer(s) in float -> gate {} ({})".format(count, "passed" if result.passed else "failed",
                                                                    result.summary()))
        if result.passed:
            return path, result, chosen
        count = count * 2 if count * 2 <= limit or count == limit else limit
    return None, result, chosen
