"""INT8 as TensorRT computes it, on any CPU: the emulated Q/DQ model is exact fake-quantisation, the gate's verdict
does not move with ONNX Runtime's optimisation level, and the runtime never serves saturated int8 kernels."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edge.config import load_config
from edge.infer import onnxruntime_backend, qdq_emulation
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend, session_options
from edge.infer.preprocess import CpuPreprocessor
from edge.infer.qdq_emulation import emulated_model, fake_quantize, int8_kernels_saturate
from edge.model.plan import check_inputs
from edge.model.steps import BuildState, judge


def _session(model, level, prepacking=True):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    if not prepacking:  # a constant weight is prepacked (another summation order); a dequantized one never is
        options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _tensors(digits, count=24):
    prep = CpuPreprocessor(digits.preprocess)
    return [prep(img).copy() for img in digits.test_images[:count]]


def test_fake_quantize_rounds_half_to_even_and_saturates_like_quantizelinear():
    x = np.array([[-300.0, -1.5, -0.5, 0.5, 1.5, 2.5, 126.6, 300.0]], np.float32)
    expected = np.array([[-128, -2, 0, 0, 2, 2, 127, 127]], np.float32)
    assert np.array_equal(fake_quantize(x, np.float32(1.0), np.int8(0)), expected)
    per_channel = fake_quantize(np.full((2, 3), 10.0, np.float32), np.array([4.0, 0.01], np.float32),
                                np.zeros(2, np.int8), axis=0)
    assert np.array_equal(per_channel, np.array([[8, 8, 8], [1.27, 1.27, 1.27]], np.float32))


def test_emulated_model_is_the_exact_fake_quantisation_at_every_optimisation_level(digits, digits_qdq):
    qdq = onnx.load(digits_qdq)
    emulated = emulated_model(qdq)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in emulated.graph.node)
    onnx.checker.check_model(emulated)
    unfused = _session(qdq, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, prepacking=False)  # Q/DQ one by one
    same_order = _session(emulated, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, prepacking=False)
    optimised = _session(emulated, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    for tensor in _tensors(digits):
        want = unfused.run(None, {"input": tensor})[0]
        assert np.array_equal(same_order.run(None, {"input": tensor})[0], want)
        # Fused float kernels sum in another order: a value on a rounding edge may land one int8 step away,
        # as it may on the engine. Never the int8 kernels' saturation (tens of percent).
        got = optimised.run(None, {"input": tensor})[0]
        assert np.argmax(got) == np.argmax(want)
        assert np.linalg.norm(got - want) <= 0.03 * np.linalg.norm(want)


def test_gate_verdict_is_identical_with_optimisations_forced_on_and_off(digits, digits_qdq, monkeypatch, tmp_path):
    cfg = load_config(None, {"build.calibration_dir": digits.calibration, "build.regression_dir": digits.regression,
                             "build.engines_dir": str(tmp_path), "preprocess.resize": 64, "preprocess.crop": 64})
    plan = check_inputs(cfg, digits.onnx, show_progress=False)

    reports = []
    for level in ("ORT_ENABLE_ALL", "ORT_DISABLE_ALL"):
        original = onnxruntime_backend.session_options

        def forced(module, *args, level=level, original=original):
            options = original(module, *args)
            options.graph_optimization_level = getattr(module.GraphOptimizationLevel, level)
            return options

        monkeypatch.setattr(onnxruntime_backend, "session_options", forced)
        reports.append(judge(plan, BuildState(digits_qdq), plan.fmt.runner, 1).report)
        monkeypatch.undo()
    on, off = reports
    assert on["passed"] is off["passed"] is True and on["samples"] == off["samples"] == 297
    assert abs(on["agreement"] - off["agreement"]) <= 1 / 297  # at most one sample on a rounding edge
    assert abs(on["mean_cosine"] - off["mean_cosine"]) < 1e-3


def test_the_runtime_serves_int8_as_the_gate_judged_it_on_any_cpu(digits, digits_qdq):
    """The served Q/DQ model is the emulated arithmetic the gate judged, whatever this CPU's int8 kernels do;
    emulate_int8=False is ONNX Runtime's fused kernels."""
    reference = _session(emulated_model(onnx.load(digits_qdq)), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    with OnnxRuntimeBackend(digits_qdq) as backend, OnnxRuntimeBackend(digits_qdq, emulate_int8=False) as fused:
        assert backend.describe()["precision"] == "int8-qdq" and backend.describe()["int8"] == "emulated"
        assert fused.describe()["int8"] == "onnxruntime-kernels"
        for tensor in _tensors(digits, 8):
            assert np.allclose(backend.infer(tensor), reference.run(None, {"input": tensor})[0], atol=1e-5)


def test_qdq_model_served_on_this_cpu_keeps_the_fp32_top1(digits, digits_qdq):
    """Whatever this CPU's int8 kernels do, the served INT8 model answers like FP32 on the held-out digits."""
    assert isinstance(int8_kernels_saturate(), bool)
    tensors = _tensors(digits, 297)
    with OnnxRuntimeBackend(digits.onnx, 1, spinning=False) as fp32, \
            OnnxRuntimeBackend(digits_qdq, 1, spinning=False) as int8:
        fp32_top1 = np.mean([np.argmax(fp32.infer(t)) == y for t, y in zip(tensors, digits.test_labels)])
        int8_top1 = np.mean([np.argmax(int8.infer(t)) == y for t, y in zip(tensors, digits.test_labels)])
    assert int8_top1 >= fp32_top1 - 0.01


def test_probe_model_detects_the_saturating_product_it_was_built_for():
    """The probe's exact answer is 64 per channel; a u8s8 kernel with 16-bit pair sums gives 1 (see the docstring)."""
    model = qdq_emulation._probe_model()
    feed = {"x": np.ones((1, 64, 1, 1), np.float32)}
    exact = _session(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feed)[0]
    assert np.array_equal(exact, np.full((1, 8, 1, 1), 64.0, np.float32))
    # fused as every session of ours runs it (x64quantprecision on: it fixes the AVX2 kernels it can)
    fused = ort.InferenceSession(model.SerializeToString(), session_options(ort, 1, False),
                                 providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert int8_kernels_saturate() == (not np.allclose(fused, exact, rtol=0.02, atol=0.0))


def test_a_float_model_passes_through_unchanged(digits):
    model = onnx.load(digits.onnx)
    assert emulated_model(model).SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("dq_scale, activation_scale", [(0.1, [0.05]), (0.05, [0.05, 0.05])])
def test_a_pair_it_cannot_rewrite_is_refused_not_left_to_the_fused_kernels(dq_scale, activation_scale):
    """A DequantizeLinear with another scale than its QuantizeLinear, or a per-channel activation scale: TensorRT's
    arithmetic is undefined there, so the emulation names the node instead of handing it to ONNX Runtime."""
    from onnx import TensorProto, helper, numpy_helper

    from edge.errors import EdgeError

    q_scale = np.asarray(activation_scale, np.float32).reshape(-1 if len(activation_scale) > 1 else ())
    inits = [numpy_helper.from_array(q_scale, "qs"), numpy_helper.from_array(np.zeros(q_scale.shape, np.int8), "qz"),
             numpy_helper.from_array(np.full(q_scale.shape, dq_scale, np.float32), "ds")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "qs", "qz"], ["xq"], name="xq", axis=1),
             helper.make_node("DequantizeLinear", ["xq", "ds", "qz"], ["y"], name="xd", axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(EdgeError, match="^(QuantizeLinear xq|DequantizeLinear xd): cannot be computed as TensorRT "
                                        "computes it"):
        emulated_model(model)


def test_every_session_asks_for_int8_kernels_that_do_not_saturate():
    """session.x64quantprecision: u8u8 products on x86 without VNNI (a no-op elsewhere), in every session of ours."""
    options = onnxruntime_backend.session_options(ort, 1, False)
    assert options.get_session_config_entry(onnxruntime_backend.X64_QUANT_PRECISION) == "1"
