"""Where Q/DQ pairs go: the way TensorRT fuses (NVIDIA's Q/DQ placement recommendations, as ModelOpt places them).

TensorRT fuses a Conv (or Gemm/MatMul) with its activation and a residual Add into one INT8 kernel when the graph
quantizes only the layer's inputs (activation and weight) and the Add's *residual* input, the branch that is not
the fused convolution's own output. A pair anywhere else (on a Conv output before its ReLU/HardSwish, on both Add
inputs, on pooling or Flatten) blocks that fusion and rounds the tensor a second time. ONNX Runtime's quantizer puts
pairs everywhere it can; `tensorrt_placement` keeps only those TensorRT's fusion wants and rewires the rest to float.
"""

from typing import Any, Dict, List, Set, Tuple

from edge.errors import require

WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# what ONNX Runtime is asked to quantize: the weighted layers and Add (for its residual input); never an activation,
# which ONNX Runtime would otherwise drop into the scale of the pair before it (a ReLU6 Clip removed from the graph)
OP_TYPES = WEIGHTED + ("Add",)


def residual_inputs(model: Any) -> Set[Tuple[str, int]]:
    """(Add node name, input index) of every residual input of a float model: the Add input that is not a
    convolution's output read by this Add alone (the branch TensorRT fuses into that convolution)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    readers: Dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    constants = {i.name for i in model.graph.initializer}
    found: Set[Tuple[str, int]] = set()
    for node in model.graph.node:
        if node.op_type != "Add" or len(node.input) != 2 or any(name in constants for name in node.input):
            continue
        fused = [i for i, name in enumerate(node.input) if name in producers and
                 producers[name].op_type in WEIGHTED and readers.get(name) == 1]
        if not fused:
            continue  # no convolution to fuse the Add into: it stays in float
        found.add((node.name, 1 - fused[-1]))  # both fusable (two projections): the second is the fused one
    return found


def pairs_by_consumer(model: Any) -> List[Tuple[Any, int, Any, Any]]:
    """(consumer, input index, QuantizeLinear, DequantizeLinear) for every input fed through a Q -> DQ pair."""
    producers = {out: node for node in model.graph.node for out in node.output}
    found = []
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            dq = producers.get(name)
            if dq is not None and dq.op_type == "DequantizeLinear":
                q = producers.get(dq.input[0])
                if q is not None and q.op_type == "QuantizeLinear":
                    found.append((node, index, q, dq))
    return found


def _outside(consumer: Any, index: int, residual: Set[Tuple[str, int]]) -> bool:
    if consumer.op_type in WEIGHTED:
        return index > 1  # a bias: never quantized (validate_qdq refuses it anyway)
    return (consumer.name, index) not in residual


def pairs_outside(model: Any, residual: Set[Tuple[str, int]]) -> int:
    """How many Q/DQ-fed inputs lie outside TensorRT's fusion placement (pairs it would have to keep)."""
    return sum(_outside(c, i, residual) for c, i, _, _ in pairs_by_consumer(model))


def tensorrt_placement(model: Any, residual: Set[Tuple[str, int]]) -> Dict[str, int]:
    """Rewire, in place, every input fed through a Q/DQ pair outside the placement to the pair's float input, and
    drop the Q and DQ nodes nothing reads any more. Returns {"pairs": kept, "removed": rewired inputs}."""
    removed = 0
    for consumer, index, q, _ in pairs_by_consumer(model):
        if _outside(consumer, index, residual):
            consumer.input[index] = q.input[0]
            removed += 1
    drop_unread_pairs(model)
    return {"pairs": len(pairs_by_consumer(model)), "removed": removed}


def drop_unread_pairs(model: Any) -> None:
    """Remove, in place, the DequantizeLinear nodes nothing reads, then their QuantizeLinear nodes, then the
    initializers nothing reads any more (after inputs were rewired to float)."""
    graph_outputs = {o.name for o in model.graph.output}
    for _ in range(2):  # the DequantizeLinear nodes nothing reads, then their QuantizeLinear nodes
        read = {name for node in model.graph.node for name in node.input} | graph_outputs
        keep = [n for n in model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
                or n.output[0] in read]
        del model.graph.node[:]
        model.graph.node.extend(keep)
    used = {name for node in model.graph.node for name in node.input} | graph_outputs
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)


def apply_placement(fp32_path: str, qdq_path: str) -> Dict[str, int]:
    """tensorrt_placement on the Q/DQ model at `qdq_path` (rewritten in place), residual inputs from `fp32_path`."""
    onnx = require("onnx")
    model = onnx.load(qdq_path)
    placed = tensorrt_placement(model, residual_inputs(onnx.load(fp32_path, load_external_data=False)))
    onnx.save(model, qdq_path)
    return placed
