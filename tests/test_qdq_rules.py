"""edge.model.qdq_rules: the Q/DQ validator refuses what TensorRT refuses (unsigned or asymmetric activations, a
quantized bias, INT8 weights, per-tensor or wrong-axis weight scales, an opset outside the target's), and the opset
limit follows the target TensorRT."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType
from test_quantize import ort_quantize

from edge.errors import EdgeError
from edge.model.qdq_rules import max_opset, validate_qdq


@pytest.mark.parametrize("label, changes, expected", [
    ("ORT defaults: unsigned asymmetric activations",
     {"activation_type": "QUInt8", "extra": {"ActivationSymmetric": False}}, "zero-point is uint8"),
    ("bias quantized to int32", {"extra": {"QuantizeBias": True}}, "DequantizeLinear on a quantized bias"),
    ("INT8 weight initializers", {"extra": {"AddQDQPairToWeight": False}}, "INT8 weight initializer"),
    ("per-tensor Conv weights", {"per_channel": False}, "must be per-channel on axis 0"),
])
def test_validator_rejects_what_tensorrt_rejects(digits, tmp_path, label, changes, expected):
    if changes.get("activation_type") == "QUInt8":
        changes = dict(changes, activation_type=QuantType.QUInt8)
    problems = validate_qdq(ort_quantize(digits, str(tmp_path / "bad.onnx"), **changes))
    assert any(expected in p for p in problems), (label, problems[:5])


def test_validator_rejects_nonzero_zero_point_opset_21_float_and_garbage(digits, digits_qdq, tmp_path):
    model = onnx.load(digits_qdq)
    zp = next(i for i in model.graph.initializer if i.name.endswith("_zero_point") and not i.dims)
    zp.CopyFrom(numpy_helper.from_array(np.array(3, np.int8), zp.name))
    model.opset_import[0].version = 21
    path = str(tmp_path / "asym.onnx")
    onnx.save(model, path)
    problems = validate_qdq(path)
    assert any("non-zero zero-point" in p for p in problems)
    assert any("opset 21 outside 13-20" in p for p in problems)
    assert validate_qdq(digits.onnx) == ["no QuantizeLinear nodes: not a Q/DQ model"]
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00not a protobuf" * 10)
    assert validate_qdq(str(garbage))[0].startswith("not a readable ONNX model")


def _one_layer(tmp_path, op, weight, axis, scale=None, **attributes):
    """x -> Q/DQ -> `op`(x, Q/DQ(weight)) with the weight's scale per channel on `axis` (or `scale`)."""
    channels = weight.shape[axis]
    weight_scale = np.full(channels, 0.01, np.float32) if scale is None else np.asarray(scale, np.float32)
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(weight_scale, "ws"),
             numpy_helper.from_array(np.zeros(weight_scale.shape, np.int8), "wz"),
             numpy_helper.from_array(np.float32(0.05), "xs"), numpy_helper.from_array(np.int8(0), "xz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="xq"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="xd"),
             helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="wq", axis=axis),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="wd", axis=axis),
             helper.make_node(op, ["xd", "wd"], ["y"], name="layer", **attributes)]
    shape = [1, weight.shape[0], 4, 4] if op.startswith("Conv") else [1, weight.shape[1 if attributes else 0]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = str(tmp_path / "{}-{}.onnx".format(op, axis))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return validate_qdq(path)


def test_validator_knows_each_weighted_layers_output_channel_axis_and_refuses_bad_scales(tmp_path):
    deconv = np.ones((4, 6, 3, 3), np.float32)  # ConvTranspose: (C_in, C_out, kH, kW)
    assert _one_layer(tmp_path, "ConvTranspose", deconv, 1) == []
    assert "ConvTranspose weight scale must be per-channel on axis 1 (6 channels), got 4 values on axis 0" in \
        _one_layer(tmp_path, "ConvTranspose", deconv, 0)[0]
    gemm = np.ones((5, 3), np.float32)  # Gemm B (N, K) with transB=1: output channels on axis 0
    assert _one_layer(tmp_path, "Gemm", gemm, 0, transB=1) == []
    assert "Gemm weight scale must be per-channel on axis 0" in _one_layer(tmp_path, "Gemm", gemm, 1, transB=1)[0]
    matmul = np.ones((3, 5), np.float32)  # MatMul (K, N): the last axis
    assert _one_layer(tmp_path, "MatMul", matmul, 1) == []
    assert _one_layer(tmp_path, "MatMul", matmul, 1, scale=[0.01]) == []  # per-tensor weights are fine there
    assert "MatMul weight scale must be per-channel on axis 1" in _one_layer(tmp_path, "MatMul", matmul, 0)[0]
    conv = np.ones((6, 4, 3, 3), np.float32)
    for bad in (0.0, -0.01, np.inf, np.nan):
        scale = np.full(6, 0.01, np.float32)
        scale[2] = bad
        problems = _one_layer(tmp_path, "Conv", conv, 0, scale=scale)
        assert any("DequantizeLinear wd: scale must be positive and finite" in p for p in problems), (bad, problems)


@pytest.mark.parametrize("tensorrt, newest", [(None, 20), ("8.5.2", 17), ("8.6.1", 17), ("10.3.0", 20),
                                              ("10", 20), ("11.4.1", 25), ("8.2.1", 17)])
def test_opset_limit_follows_the_target_tensorrt(tensorrt, newest):
    assert max_opset(tensorrt) == newest


def test_validator_takes_the_target_tensorrt_into_account(digits_qdq, tmp_path):
    model = onnx.load(digits_qdq)
    model.opset_import[0].version = 19  # what ModelOpt writes
    path = str(tmp_path / "opset19.onnx")
    onnx.save(model, path)
    assert validate_qdq(path, "10.3.0") == [] and validate_qdq(path) == []
    assert validate_qdq(path, "8.5.2") == ["opset 19 outside 13-17 (what TensorRT 8.5.2 parses)"]
    with pytest.raises(EdgeError, match="TensorRT version 'ten'"):
        validate_qdq(path, "ten")
