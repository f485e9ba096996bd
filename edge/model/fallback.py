"""Float fallback for the layers INT8 breaks: find them and leave them unquantised, on the calibration side only.

Everything here is judged on the held-out split of the calibration set (edge.model.fidelity), never on the
regression set: the gate then looks at the regression set once, at the model this step chose. When the Q/DQ model
misses the gate's cosine thresholds on the held-out images, every quantised layer is ranked by how much of the
damage (mean 1 - cosine of the logits against FP32's, run as TensorRT computes it: edge.infer.qdq_emulation)
leaving that one layer in float recovers; the Q/DQ pairs in front of the 1, 2, 4, ... most damaging layers are
removed (every other scale as calibrated: the model `nodes_to_exclude` would have given) until the held-out images
meet the thresholds or `limit` layers are float. TensorRT builds layers without Q/DQ in FP16
(edge.model.tensorrt_engine sets the flag next to INT8).
"""

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edge.config import GateConfig
from edge.errors import require
from edge.infer.qdq_emulation import emulated_model, ordered_nodes
from edge.model.fidelity import Fidelity
from edge.model.placement import drop_unread_pairs, pairs_by_consumer

FP16_TIME_PER_INT8 = 2.0  # Orin's dense FP16 tensor-core rate is half its INT8 rate (on paper)
_COMPUTE = ("Conv", "ConvTranspose", "Gemm", "MatMul")
SWITCH = "edge_float_layer"  # the ranking model's extra input
RANKED_KEPT = 20  # the most damaging layers of the ranking that the manifest keeps (Polygraphy's debug precision)


def quantized_inputs(model: Any) -> Dict[str, List[Tuple[Any, Any]]]:
    """Consumer node name -> the (QuantizeLinear, DequantizeLinear) pairs feeding it."""
    pairs: Dict[str, List[Tuple[Any, Any]]] = {}
    for node, _, q, dq in pairs_by_consumer(model):
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
    drop_unread_pairs(model)
    return model


def _switchable(emulated: Any, qdq: Any, layers: Sequence[str]) -> Any:
    """`emulated` (qdq as TensorRT computes it) with an input SWITCH: the index in `layers` of the one layer whose
    output comes from its float inputs, -1 for none. Each layer gets a float twin and a Where picks between the two
    outputs (weights stay constants, so ONNX Runtime still prepacks them): every candidate is one run of one
    session instead of a model of its own."""
    onnx, helper, numpy_helper = require("onnx"), require("onnx.helper"), require("onnx.numpy_helper")
    pairs = quantized_inputs(qdq)
    nodes = {node.name: node for node in emulated.graph.node}
    for index, layer in enumerate(layers):
        node, tag = nodes[layer], "{}_{}".format(SWITCH, index)
        floats = {dq.output[0]: q.input[0] for q, dq in pairs[layer]}  # fake-quantised input -> float input
        twin = onnx.NodeProto()
        twin.CopyFrom(node)
        twin.name, twin.output[0] = tag + "_float", tag + "_float"
        twin.input[:] = [floats.get(name, name) for name in node.input]
        output, node.output[0] = node.output[0], tag + "_int8"
        emulated.graph.initializer.append(numpy_helper.from_array(np.array(index, np.int64), tag + "_index"))
        emulated.graph.node.extend([
            twin, helper.make_node("Equal", [SWITCH, tag + "_index"], [tag], name=tag),
            helper.make_node("Where", [tag, tag + "_float", tag + "_int8"], [output], name=tag + "_where")])
    emulated.graph.input.append(helper.make_tensor_value_info(SWITCH, onnx.TensorProto.INT64, []))
    ordered = ordered_nodes(list(emulated.graph.node), emulated)
    del emulated.graph.node[:]
    emulated.graph.node.extend(ordered)
    return emulated


Ranking = List[Dict[str, Any]]  # [{"node": layer, "recovers": ...}], most first


def rank_layers(fidelity: Fidelity, qdq: Any) -> Ranking:
    """Every quantised compute layer with what leaving it alone in float recovers, most first."""
    pairs = quantized_inputs(qdq)
    layers = [node.name for node in qdq.graph.node
              if node.op_type in _COMPUTE and node.name and node.name in pairs]  # an unnamed one cannot be singled out
    everything, *alone = fidelity.damages(_switchable(emulated_model(qdq), qdq, layers),
                                          [{SWITCH: np.array(i, np.int64)} for i in range(-1, len(layers))])
    ranked = [{"node": layer, "recovers": round(everything - damage, 6)} for layer, damage in zip(layers, alone)]
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


def search(fidelity: Fidelity, qdq_path: str, thresholds: GateConfig, limit: int, stage: Callable[[str], str],
           log: Callable[..., None]) -> Tuple[Optional[str], Ranking, Dict[str, Any], Ranking]:
    """Leave the most damaging layers in float until the held-out images meet the gate's cosine thresholds:
    (that model's path or None, the float layers with what each recovers, the last held-out verdict, the ranking of
    every quantised layer)."""
    onnx = require("onnx")
    qdq = onnx.load(qdq_path)
    ranked = rank_layers(fidelity, qdq)
    log("fallback: ranked {} quantised layers on {} held-out calibration images; worst: {}".format(
        len(ranked), fidelity.images,
        ", ".join("{} ({:+.4f})".format(r["node"], r["recovers"]) for r in ranked[:3])))
    count, chosen, verdict = 1, [], {}
    while count <= min(limit, len(ranked)):
        chosen = ranked[:count]
        model = without_quantization(qdq, [r["node"] for r in chosen])
        verdict = fidelity.verdict(model, thresholds)
        log("fallback: {} layer(s) in float -> held-out mean cosine {:.4f}, p5 {:.4f}{}".format(
            count, verdict["mean_cosine"], verdict["p5_cosine"], " (meets the gate's thresholds)"
            if verdict["passed"] else ""))
        if verdict["passed"]:
            path = stage(os.path.splitext(qdq_path)[0] + ".float{}.onnx".format(count))
            onnx.save(model, path)
            return path, chosen, verdict, ranked
        count = count * 2 if count * 2 <= limit or count == limit else limit
    return None, chosen, verdict, ranked
