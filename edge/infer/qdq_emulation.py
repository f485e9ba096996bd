"""INT8 Q/DQ models evaluated the way TensorRT computes them, on any CPU.

TensorRT multiplies int8 by int8 and accumulates in int32: a Q/DQ model's result is exactly its fake-quantised
float graph, y = (clip(round(x / s) + zp, lo, hi) - zp) * s at every QuantizeLinear -> DequantizeLinear pair.
ONNX Runtime's default graph optimisations fuse those pairs into its own int8 kernels instead, and on x86 CPUs
without VNNI (AVX2, AVX-512F) their u8s8 products saturate in 16-bit intermediate sums (ONNX Runtime's
quantization docs, the reduce_range note): the same model then answers differently per CPU.

`emulated_model` rewrites every pair as plain float operators (weights fake-quantised once, in NumPy), so no
optimisation level can fuse them: the result no longer depends on the CPU or on ONNX Runtime's settings.
`int8_kernels_saturate` asks this CPU's ONNX Runtime, once per process, whether its fused kernels saturate.
"""

import functools
import heapq
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edge.errors import EdgeError, require

_RANGES = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def is_qdq(model: Any) -> bool:
    return any(n.op_type == "QuantizeLinear" for n in model.graph.node)


def _constants(model: Any) -> Dict[str, np.ndarray]:
    numpy_helper = require("onnx.numpy_helper")
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _quant_params(node: Any, values: Dict[str, np.ndarray]) -> Optional[Tuple[np.ndarray, np.ndarray, int]]:
    """(scale, zero point, axis) of a Q or DQ node when both are constants; zero point uint8 0 when absent."""
    scale = values.get(node.input[1])
    zero = values.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
    if scale is None or zero is None or zero.dtype not in _RANGES:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return scale.astype(np.float32), zero, axis


def _broadcast(param: np.ndarray, axis: int, rank: int) -> np.ndarray:
    if param.size == 1:
        return param.reshape(())
    shape = [1] * rank
    shape[axis % rank] = param.size
    return param.reshape(shape)


def fake_quantize(x: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int = 1) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear with the same parameters, in float (round half to even, as ONNX)."""
    lo, hi = _RANGES[zero.dtype]
    s = _broadcast(scale, axis, x.ndim)
    z = _broadcast(zero.astype(np.float32), axis, x.ndim)
    q = np.clip(np.round(x.astype(np.float32) / s) + z, lo, hi)
    return ((q - z) * s).astype(np.float32)


def _pairs(model: Any, values: Dict[str, np.ndarray]) -> List[Tuple[Any, Any]]:
    """Every (QuantizeLinear, DequantizeLinear) pair with constant, equal parameters: per-channel on weights,
    per-tensor on activations (what TensorRT accepts; anything else is left to ONNX Runtime as it is)."""
    consumers: Dict[str, List[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    pairs = []
    for q in model.graph.node:
        if q.op_type != "QuantizeLinear":
            continue
        qp = _quant_params(q, values)
        if qp is not None and qp[0].size != 1 and q.input[0] not in values:
            continue
        for dq in consumers.get(q.output[0], []):
            dp = _quant_params(dq, values) if dq.op_type == "DequantizeLinear" else None
            if qp is not None and dp is not None and all(np.array_equal(a, b) for a, b in zip(qp, dp)):
                pairs.append((q, dq))
    return pairs


def _float_chain(q: Any, dq: Any, values: Dict[str, np.ndarray], tag: str) -> Tuple[List[Any], List[Any]]:
    """Nodes and constants computing dq's output from q's input as fake quantisation (per-tensor activations)."""
    helper, numpy_helper = require("onnx.helper"), require("onnx.numpy_helper")
    scale, zero, _ = _quant_params(q, values)  # type: ignore[misc]
    lo, hi = _RANGES[zero.dtype]
    offset = float(zero.reshape(-1)[0])  # clip(round(x / s) + z, lo, hi) - z == clip(round(x / s), lo - z, hi - z)
    consts = {"scale": scale.reshape(()), "lo": np.float32(lo - offset), "hi": np.float32(hi - offset)}
    names = {k: "{}_{}".format(tag, k) for k in consts}
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), names[k]) for k, v in consts.items()]
    x, y = q.input[0], dq.output[0]
    nodes = [helper.make_node("Div", [x, names["scale"]], [tag + "_scaled"], name=tag + "_div"),
             helper.make_node("Round", [tag + "_scaled"], [tag + "_rounded"], name=tag + "_round"),
             helper.make_node("Clip", [tag + "_rounded", names["lo"], names["hi"]], [tag + "_clipped"],
                              name=tag + "_clip"),
             helper.make_node("Mul", [tag + "_clipped", names["scale"]], [y], name=tag + "_mul")]
    return nodes, inits


def emulated_model(model: Any) -> Any:
    """A copy of the Q/DQ `model` whose Q -> DQ pairs are float operators; weights are fake-quantised constants.
    A QuantizeLinear or DequantizeLinear it cannot rewrite is refused (EdgeError naming it), never left to ONNX
    Runtime's fused kernels, whose arithmetic is not TensorRT's."""
    onnx, numpy_helper = require("onnx"), require("onnx.numpy_helper")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    values = _constants(model)
    removed, added_nodes, added_inits = set(), [], []
    for number, (q, dq) in enumerate(_pairs(model, values)):
        removed.add(dq.output[0])  # protobuf wrappers have no stable identity: nodes are named by output
        source = q.input[0]
        if source in values:  # a weight: fake-quantised once, here
            scale, zero, axis = _quant_params(q, values)  # type: ignore[misc]
            added_inits.append(numpy_helper.from_array(fake_quantize(values[source], scale, zero, axis), dq.output[0]))
            continue
        nodes, inits = _float_chain(q, dq, values, "fq{}".format(number))
        added_nodes.extend(nodes)
        added_inits.extend(inits)
    kept = [n for n in model.graph.node if n.op_type != "DequantizeLinear" or n.output[0] not in removed]
    still_read = {name for n in kept + added_nodes for name in n.input} | {o.name for o in model.graph.output}
    kept = [n for n in kept if n.op_type != "QuantizeLinear" or n.output[0] in still_read]
    left = next((n for n in kept if n.op_type in ("QuantizeLinear", "DequantizeLinear")), None)
    if left is not None:
        raise EdgeError("{} {}: cannot be computed as TensorRT computes it (a Q -> DQ pair needs constant, equal "
                        "scales and int8/uint8 zero points, per-tensor on activations); refused rather than run on "
                        "ONNX Runtime's own int8 kernels".format(left.op_type, left.name or left.output[0]))
    del model.graph.node[:]
    model.graph.initializer.extend(added_inits)
    model.graph.node.extend(ordered_nodes(kept + added_nodes, model))
    return model


def ordered_nodes(nodes: List[Any], model: Any) -> List[Any]:
    """Topological order (ONNX requires it), keeping the given order wherever it already is one: Kahn's algorithm
    taking the earliest ready node first (linear, for models with thousands of nodes)."""
    available = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    produced = {name for node in nodes for name in node.output}
    readers: Dict[str, List[int]] = {}
    waiting = []
    for index, node in enumerate(nodes):
        needs = {name for name in node.input if name not in available}
        if not needs <= produced:
            raise ValueError("graph has a missing input at node " + (node.name or node.op_type))
        for name in needs:
            readers.setdefault(name, []).append(index)
        waiting.append(len(needs))
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        ordered.append(node)
        for name in node.output:
            for reader in readers.pop(name, ()):
                waiting[reader] -= 1
                if waiting[reader] == 0:
                    heapq.heappush(ready, reader)
    if len(ordered) < len(nodes):
        stuck = next(node for index, node in enumerate(nodes) if waiting[index] > 0)
        raise ValueError("graph has a cycle at node " + (stuck.name or stuck.op_type))
    return ordered


@functools.lru_cache(maxsize=1)
def int8_kernels_saturate() -> bool:
    """Whether this CPU's fused ONNX Runtime int8 kernels lose precision on a product they must get right, with
    session.x64quantprecision on (edge.infer.onnxruntime_backend.session_options: u8u8 products on x86 without VNNI).

    A 1x1 convolution of 64 channels at the top of the int8 range (x = w = 127 in int8, exact result 64 after
    requantisation) runs once fused (default optimisations) and once emulated; VNNI and ARM kernels agree, the
    AVX2 u8s8 path's 16-bit pair sums (2 x 255 x 127 > 32767) do not.
    """
    ort = require("onnxruntime")
    model = _probe_model()
    feed = {"x": np.ones((1, 64, 1, 1), np.float32)}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.x64quantprecision", "1")  # as every session of ours: where it fixes
    fused = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    emulated = ort.InferenceSession(emulated_model(model).SerializeToString(), options,
                                    providers=["CPUExecutionProvider"])
    got, want = fused.run(None, feed)[0], emulated.run(None, feed)[0]
    return not np.allclose(got, want, rtol=0.02, atol=0.0)


def _probe_model() -> Any:
    helper, numpy_helper, tp = require("onnx.helper"), require("onnx.numpy_helper"), require("onnx").TensorProto
    c_in, c_out = 64, 8

    def qdq(name: str, source: str, scale: float) -> List[Any]:
        return [helper.make_node("QuantizeLinear", [source, name + "_s", name + "_z"], [name + "_q"]),
                helper.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name])]

    inits = [numpy_helper.from_array(np.ones((c_out, c_in, 1, 1), np.float32), "w_fp32")]
    for name, scale in (("xq", 1 / 127), ("wq", 1 / 127), ("yq", 1.0)):
        inits += [numpy_helper.from_array(np.float32(scale), name + "_s"),
                  numpy_helper.from_array(np.int8(0), name + "_z")]
    nodes = qdq("xq", "x", 1 / 127) + qdq("wq", "w_fp32", 1 / 127)
    nodes.append(helper.make_node("Conv", ["xq", "wq"], ["conv"]))
    nodes += qdq("yq", "conv", 1.0)
    graph = helper.make_graph(nodes, "int8_saturation_probe",
                              [helper.make_tensor_value_info("x", tp.FLOAT, [1, c_in, 1, 1])],
                              [helper.make_tensor_value_info("yq", tp.FLOAT, [1, c_out, 1, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
