"""What TensorRT's ONNX parser accepts of an INT8 Q/DQ model (tensorrt-int8.md), and the check of it.

Symmetric signed INT8 (zero points int8 0), positive finite scales, per-tensor activation scales, per-channel
weight scales on the output-channel axis (Conv 0, ConvTranspose 1, Gemm 0 or 1 by transB, MatMul the last), FP32
weights behind QuantizeLinear -> DequantizeLinear (no INT8 initializers), no DequantizeLinear feeding a bias, and
an opset from 13 up to what the target TensorRT parses.
"""

from typing import Any, Dict, List, Optional

import numpy as np

from edge.errors import EdgeError, first_line, require

OPSET_MIN, OPSET_MAX = 13, 20  # per-axis QuantizeLinear needs 13; ORT static INT8 does not support >= 21
# The newest opset TensorRT's ONNX parser reads, from (major, minor) on: onnx-tensorrt docs/operators.md of each
# release ("TensorRT 8.5 supports operators up to Opset 17", "TensorRT 10.0 ... opset 9 to opset 20") and
# NVIDIA's ONNX Opset Guide for 11.x (25). ModelOpt's opset-19 output therefore needs TensorRT >= 10.
TENSORRT_MAX_OPSET = (((8, 5), 17), ((8, 6), 17), ((10, 0), 20), ((11, 0), 25))


def node_consumers(model: Any) -> Dict[str, List[Any]]:
    consumers: Dict[str, List[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return consumers


def opset_of(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def max_opset(tensorrt: Optional[str]) -> int:
    """The newest opset a Q/DQ model may have for TensorRT `tensorrt` ('8.5.2', '10.3.0'); None: no target named,
    the limit ONNX Runtime's quantizer and TensorRT 10 share. Releases before 8.5 get 8.5's (they are refused
    when an engine is built)."""
    if tensorrt is None:
        return OPSET_MAX
    try:
        version = tuple(int(part) for part in (tensorrt.split(".") + ["0"])[:2])
    except ValueError:
        raise EdgeError("TensorRT version {!r}: expected MAJOR.MINOR[.PATCH]".format(tensorrt)) from None
    return max([limit for since, limit in TENSORRT_MAX_OPSET if since <= version] or [TENSORRT_MAX_OPSET[0][1]])


def _tensor_values(model: Any) -> Dict[str, np.ndarray]:
    numpy_helper = require("onnx.numpy_helper")
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:  # Constant nodes are initializers too, for this purpose
        if node.op_type == "Constant" and node.attribute:
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


class _Graph:
    """The lookups every rule needs, made once."""

    def __init__(self, model: Any) -> None:
        self.values = _tensor_values(model)
        self.initializers = {i.name: i for i in model.graph.initializer}
        self.producers = {out: node for node in model.graph.node for out in node.output}
        self.consumers = node_consumers(model)
        onnx = require("onnx")
        self.quantized_types = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT32}


def _zero_point_problem(node: Any, g: _Graph, where: str) -> Optional[str]:
    if len(node.input) < 3 or not node.input[2]:
        return "{}: no zero-point (defaults to uint8)".format(where)
    zp = g.values.get(node.input[2])
    if zp is None:
        return "{}: zero-point is not a constant".format(where)
    if zp.dtype != np.int8:
        return "{}: zero-point is {}, TensorRT needs signed int8".format(where, zp.dtype)
    if np.any(zp != 0):
        return "{}: non-zero zero-point (asymmetric), TensorRT needs 0".format(where)
    return None


def _stored_quantized(node: Any, g: _Graph, where: str) -> str:
    """A DequantizeLinear reading an initializer: only a bias or an INT8 weight does that."""
    targets = [(c, list(c.input).index(node.output[0])) for c in g.consumers.get(node.output[0], [])]
    if any(c.op_type in ("Conv", "ConvTranspose", "Gemm") and idx == 2 for c, idx in targets):
        return "{}: DequantizeLinear on a quantized bias".format(where)
    return "{}: INT8 weight initializer '{}' (keep FP32 weights with Q->DQ)".format(where, node.input[0])


def _weight_axis(consumer: Any, weight: np.ndarray) -> Optional[int]:
    """The output-channel axis of a weight read as input 1 of `consumer`: Conv (C_out, C_in, ...) 0, ConvTranspose
    (C_in, C_out, ...) 1, Gemm B 0 with transB else 1, MatMul (K, N) the last; None for any other reader."""
    if consumer.op_type == "Conv":
        return 0
    if consumer.op_type == "ConvTranspose":
        return 1
    if consumer.op_type == "Gemm":
        return 0 if next((a.i for a in consumer.attribute if a.name == "transB"), 0) else 1
    if consumer.op_type == "MatMul":
        return weight.ndim - 1
    return None


def _weight_scale_problems(node: Any, scale: np.ndarray, g: _Graph, where: str) -> List[str]:
    """Per-channel on the output-channel axis (TensorRT's only per-axis weight quantisation); Gemm and MatMul may
    also be per-tensor."""
    problems = []
    weight = g.values.get(g.producers[node.input[0]].input[0]) if node.input[0] in g.producers else None
    if weight is None:
        return problems
    for consumer in g.consumers.get(node.output[0], []):
        if list(consumer.input).index(node.output[0]) != 1:
            continue
        want = _weight_axis(consumer, weight)
        if want is None:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % max(weight.ndim, 1)
        channels = weight.shape[want]
        per_tensor_ok = consumer.op_type in ("Gemm", "MatMul") and scale.size == 1
        if not per_tensor_ok and (scale.size != channels or axis != want):
            problems.append("{}: {} weight scale must be per-channel on axis {} ({} channels), got {} values on axis "
                            "{}".format(where, consumer.op_type, want, channels, scale.size, axis))
    return problems


def _qdq_node_problems(node: Any, g: _Graph) -> List[str]:
    where = "{} {}".format(node.op_type, node.name or node.output[0])
    problems = [p for p in [_zero_point_problem(node, g, where)] if p]
    scale = g.values.get(node.input[1])
    if scale is None:
        return problems + ["{}: scale is not a constant".format(where)]
    if not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
        problems.append("{}: scale must be positive and finite, got {}".format(where, scale.reshape(-1)[:3]))
    source = node.input[0]
    if node.op_type == "DequantizeLinear" and source in g.initializers:
        if g.initializers[source].data_type in g.quantized_types:
            problems.append(_stored_quantized(node, g, where))
        return problems
    is_weight = node.op_type == "QuantizeLinear" and source in g.initializers
    if node.op_type == "DequantizeLinear" and source in g.producers and g.producers[source].op_type == "QuantizeLinear":
        is_weight = g.producers[source].input[0] in g.initializers
    if not is_weight:
        if scale.size != 1:
            problems.append("{}: activation scale is per-channel ({} values), TensorRT needs per-tensor".format(
                where, scale.size))
    elif node.op_type == "DequantizeLinear":
        problems.extend(_weight_scale_problems(node, scale, g, where))
    return problems


def validate_qdq(model_path: str, tensorrt: Optional[str] = None) -> List[str]:
    """Every reason TensorRT would refuse (or mis-build) this Q/DQ model; empty when it is fine.

    `tensorrt`: the target TensorRT version, whose parser limits the opset (TENSORRT_MAX_OPSET)."""
    onnx = require("onnx")
    try:
        model = onnx.load(model_path)
    except Exception as exc:  # protobuf raises its own DecodeError
        return ["not a readable ONNX model ({})".format(first_line(exc))]
    problems: List[str] = []
    opset, newest = opset_of(model), max_opset(tensorrt)
    if not OPSET_MIN <= opset <= newest:
        problems.append("opset {} outside {}-{}{}".format(opset, OPSET_MIN, newest, "" if tensorrt is None else
                                                           " (what TensorRT {} parses)".format(tensorrt)))
    g = _Graph(model)
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    if not any(n.op_type == "QuantizeLinear" for n in qdq):
        problems.append("no QuantizeLinear nodes: not a Q/DQ model")
    for node in qdq:
        problems.extend(_qdq_node_problems(node, g))
    for node in model.graph.node:  # biases fed by a DequantizeLinear, whatever its input
        if node.op_type in ("Conv", "ConvTranspose", "Gemm") and len(node.input) > 2 and node.input[2]:
            producer = g.producers.get(node.input[2])
            if producer is not None and producer.op_type == "DequantizeLinear" and \
                    producer.input[0] not in g.initializers:
                problems.append("{} {}: bias comes from a DequantizeLinear".format(node.op_type, node.name))
    return problems
