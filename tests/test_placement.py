"""edge.model.placement: Q/DQ pairs sit where TensorRT fuses them (weighted-layer and residual inputs only), and ONNX
Runtime's own placement is rewritten to that rule."""

import onnx
from test_quantize import ort_quantize

from edge.model.placement import pairs_outside, residual_inputs, tensorrt_placement
from edge.model.qdq_rules import validate_qdq


def test_qdq_pairs_sit_where_tensorrt_fuses(digits, digits_qdq, tmp_path):
    """Weighted-layer inputs and residual inputs only: every activation stays in the graph, the residual Adds read
    their skip branch quantised and the convolution they fuse into in float. ONNX Runtime's own placement (pairs
    on every quantisable op) is rewritten to the same rule."""
    fp32, qdq = onnx.load(digits.onnx), onnx.load(digits_qdq)
    residual = residual_inputs(fp32)
    adds = [n for n in fp32.graph.node if n.op_type == "Add"]
    assert adds and len(residual) == len(adds)  # MobileNetV3-Small's inverted residuals
    assert pairs_outside(qdq, residual) == 0
    for op in ("HardSwish", "Relu", "HardSigmoid", "Mul", "GlobalAveragePool"):
        assert sum(n.op_type == op for n in qdq.graph.node) == sum(n.op_type == op for n in fp32.graph.node), op
    producers = {o: n for n in qdq.graph.node for o in n.output}
    for add in (n for n in qdq.graph.node if n.op_type == "Add"):
        fed = [producers.get(i) is not None and producers[i].op_type == "DequantizeLinear" for i in add.input]
        assert fed == [(add.name, i) in residual for i in range(2)] and sum(fed) == 1
    everywhere = ort_quantize(digits, str(tmp_path / "ort.onnx"))  # ONNX Runtime's placement
    model = onnx.load(everywhere)
    before = pairs_outside(model, residual)
    placed = tensorrt_placement(model, residual)
    assert before > 0 and placed["removed"] == before and pairs_outside(model, residual) == 0
    onnx.save(model, everywhere)
    assert validate_qdq(everywhere) == []
