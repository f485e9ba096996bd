"""Q/DQ quantization for TensorRT: the produced model meets every TensorRT requirement (the validator's own tests:
test_qdq_rules.py), calibration methods really differ, sensitive nodes stay float."""

import io
import os
import re
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.config import PreprocessConfig
from edge.errors import EdgeError
from edge.model import quantize as quant
from edge.model.calibration import CalibrationSet, load_calibration_set
from edge.model.qdq_rules import validate_qdq
from edge.model.quantize import PreprocessedReader, compute_ranges, kept_in_float, quantize_qdq, sensitive_nodes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
quiet = lambda *a: None  # noqa: E731


TINY_PRE = PreprocessConfig(resize=36, crop=32)  # the shipped images to tiny_model's 32x32 input


def subset(s, n):
    return CalibrationSet(s.root, s.files[:n], s.sha256, s.manifest)


def default_images(n):
    """The first `n` images of the shipped default calibration set."""
    return subset(load_calibration_set(os.path.join(REPO, "calibration", "default")), n)


def test_qdq_model_meets_every_tensorrt_requirement(digits, digits_qdq):
    assert validate_qdq(digits_qdq) == []
    model = onnx.load(digits_qdq)
    assert model.opset_import[0].version == 17
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert len(qdq) > 100
    for n in qdq:  # signed, symmetric
        assert inits[n.input[2]].dtype == np.int8 and not inits[n.input[2]].any()
    quantized_convs = 0
    for conv in (n for n in model.graph.node if n.op_type == "Conv"):
        w = producers.get(conv.input[1])
        if w is None:
            continue  # kept in float
        quantized_convs += 1
        q = producers[w.input[0]]  # weight: FP32 initializer -> Q -> DQ, per channel on axis 0
        assert w.op_type == "DequantizeLinear" and q.op_type == "QuantizeLinear"
        assert inits[q.input[0]].dtype == np.float32
        assert inits[w.input[1]].shape == (inits[q.input[0]].shape[0],)
        assert helper.get_attribute_value(next(a for a in w.attribute if a.name == "axis")) == 0
        x = producers[conv.input[0]]  # activation: per tensor
        assert x.op_type == "DequantizeLinear" and inits[x.input[1]].size == 1
        assert len(conv.input) < 3 or conv.input[2] not in producers or producers[conv.input[2]].op_type != \
            "DequantizeLinear"
    assert quantized_convs == 51  # all but the first
    # The only INT8 initializers are zero-points; nothing quantized is stored (weights stay FP32).
    zero_points = {n.input[2] for n in qdq}
    assert {i.name for i in model.graph.initializer if i.data_type == TensorProto.INT8} == zero_points


def ort_quantize(digits, out, **changes):
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    kwargs = dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                  per_channel=True, reduce_range=False, calibrate_method=CalibrationMethod.MinMax,
                  extra_options=dict(quant.EXTRA_OPTIONS))
    extra = changes.pop("extra", {})
    kwargs.update(changes)
    kwargs["extra_options"].update(extra)
    reader = PreprocessedReader(subset(load_calibration_set(digits.calibration), 8), digits.preprocess, chunk=8)
    reader.next_chunk()
    quantize_static(digits.onnx, out, reader, **kwargs)
    return out


def test_sensitive_nodes_cover_mobilenet_v3_and_the_legacy_hardswish_form(digits, digits_qdq):
    model = onnx.load(digits.onnx)
    names = sensitive_nodes(model)
    by_type = {}
    for n in model.graph.node:
        if n.name in names:
            by_type[n.op_type] = by_type.get(n.op_type, 0) + 1
    # 9 squeeze-excite HardSigmoid->Mul pairs, 19 HardSwish, first Conv, classifier Gemm.
    assert by_type == {"HardSigmoid": 9, "Mul": 9, "HardSwish": 19, "Conv": 1, "Gemm": 1}
    assert "/features/features.0/features.0.0/Conv" in names and "/classifier/classifier.3/Gemm" in names
    # Older exporters write hard-swish as x * HardSigmoid(x): that Mul is sensitive, a plain Mul is not.
    graph = helper.make_graph(
        [helper.make_node("HardSigmoid", ["x"], ["hs"], name="hsig"),
         helper.make_node("Mul", ["x", "hs"], ["hswish"], name="hswish_mul"),
         helper.make_node("Mul", ["hswish", "x"], ["y"], name="plain_mul")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    assert sensitive_nodes(helper.make_model(graph)) == ["hsig", "hswish_mul"]
    # In the quantized model the first Conv and the classifier read float tensors.
    qdq = onnx.load(digits_qdq)
    producers = {o: n for n in qdq.graph.node for o in n.output}
    for name in ("/features/features.0/features.0.0/Conv", "/classifier/classifier.3/Gemm"):
        node = next(n for n in qdq.graph.node if n.name == name)
        assert all(producers.get(i) is None or producers[i].op_type != "DequantizeLinear" for i in node.input)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """Conv -> Relu -> Conv with seeded weights on a 1x3x32x32 input: fast to calibrate."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2, "w2")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
         helper.make_node("Conv", ["r1", "w2"], ["logits"], name="conv2", pads=[1, 1, 1, 1])],
        "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 8, 32, 32])], initializer=[w1, w2])
    path = str(tmp_path_factory.mktemp("tiny") / "tiny.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _amax(ranges):
    return {k: float(np.max(np.abs(np.asarray(v.range_value, np.float64)))) for k, v in ranges.data.items()}


def test_entropy_calibration_really_differs_from_minmax(tiny_model, tmp_path):
    from onnxruntime.quantization import CalibrationMethod, create_calibrator

    images = default_images(16)
    minmax = _amax(compute_ranges(tiny_model, images, TINY_PRE, "minmax", str(tmp_path), show_progress=False))
    entropy = _amax(compute_ranges(tiny_model, images, TINY_PRE, "entropy", str(tmp_path), show_progress=False))
    assert minmax.keys() == entropy.keys()
    assert all(entropy[k] <= minmax[k] * (1 + 1e-6) for k in minmax)
    assert any(entropy[k] < 0.9 * minmax[k] for k in minmax), (minmax, entropy)
    # The pitfall this avoids: ONNX Runtime's default entropy bins (what quantize_static uses) give MinMax's ranges.
    default = create_calibrator(tiny_model, None, str(tmp_path / "aug.onnx"), CalibrationMethod.Entropy,
                                extra_options={"symmetric": True})
    reader = PreprocessedReader(images, TINY_PRE, chunk=16)
    reader.next_chunk()
    with quant._quiet():
        default.collect_data(reader)
        same = _amax(default.compute_data())
    assert all(abs(same[k] - minmax[k]) <= 1e-3 * minmax[k] for k in minmax if k in same)


def test_the_builds_sessions_each_keep_to_one_core(tiny_model):
    """A rebuild runs beside the service: the calibrator's, the fidelity's and the gate's sessions run one intra-op
    thread that does not spin (docs/build.md, quantization)."""
    from types import SimpleNamespace

    from edge.model.fidelity import Fidelity
    from edge.model.plan import onnx_runner

    images = default_images(2)
    calibrator = SimpleNamespace(augmented_model_path=tiny_model, execution_providers=["CPUExecutionProvider"])
    with onnx_runner(tiny_model) as gate:
        sessions = [quant.calibration_session(calibrator), gate.session,
                    Fidelity(tiny_model, images, TINY_PRE)._session(onnx.load(tiny_model))]
        for session in sessions:
            options = session.get_session_options()
            assert options.intra_op_num_threads == 1
            assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_quantization_writes_nothing_beside_the_fp32_model(tiny_model, tmp_path, monkeypatch):
    """ONNX Runtime's calibrator and quantize_static write <model>-inferred.onnx beside their input: a build must
    give them a copy, or a read-only model folder fails and two builds of one model race on that file."""
    written = []
    infer = onnx.shape_inference.infer_shapes_path
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes_path",
                        lambda src, dst="", *a, **k: written.append(dst or src) or infer(src, dst, *a, **k))
    images = default_images(8)
    quantize_qdq(tiny_model, str(tmp_path / "tiny.int8.onnx"), images, TINY_PRE,
                 show_progress=False, log=lambda *a: None)
    assert written and not [p for p in written if os.path.dirname(p) == os.path.dirname(tiny_model)], written


def test_older_onnxruntime_fallback_gives_the_same_minmax_model(tiny_model, tmp_path, monkeypatch):
    images = default_images(8)
    first = str(tmp_path / "cache-path.onnx")
    quantize_qdq(tiny_model, first, images, TINY_PRE, "minmax", True, show_progress=False, log=quiet)
    monkeypatch.setattr(quant, "_quantize_static_has_cache", lambda: False)
    second = str(tmp_path / "fallback.onnx")
    quantize_qdq(tiny_model, second, images, TINY_PRE, "minmax", True, show_progress=False, log=quiet)
    scales = [{i.name: numpy_helper.to_array(i) for i in onnx.load(p).graph.initializer if i.name.endswith("_scale")}
              for p in (first, second)]
    # conv2: its input, its output, its weights (conv1, the first Conv, stays float: sensitive)
    assert scales[0].keys() == scales[1].keys() == {"r1_scale", "logits_scale", "w2_scale"}
    assert all(np.allclose(scales[0][k], scales[1][k], rtol=1e-6) for k in scales[0])
    with pytest.raises(EdgeError, match="entropy needs onnxruntime"):
        quantize_qdq(tiny_model, second, images, TINY_PRE, "entropy", True, show_progress=False, log=quiet)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal_only_one_log_line_and_no_leftovers(tiny_model, tmp_path, capsys,
                                                                       monkeypatch):
    images = default_images(8)
    quantize_qdq(tiny_model, str(tmp_path / "a.onnx"), images, TINY_PRE, "minmax", False, log=quiet)
    assert capsys.readouterr().err == ""  # a log or the journal gets no carriage-return frames
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    lines = []
    out = str(tmp_path / "q.onnx")
    info = quantize_qdq(tiny_model, out, images, TINY_PRE, "percentile", False, show_progress=True, log=lines.append)
    os.remove(str(tmp_path / "a.onnx"))
    assert "calibrate (percentile)" in terminal.getvalue() and "/8" in terminal.getvalue()
    assert len(lines) == 1 and "(onnxruntime percentile, 8 images, 0 nodes kept in float, " in lines[0]
    assert info["method"] == "percentile" and info["excluded_nodes"] == [] and info["quantizer"] == "onnxruntime"
    assert "{} Q/DQ nodes)".format(info["qdq_nodes"]) in lines[0] and info["qdq_nodes"] >= 8  # 2 Convs: 2 pairs each
    assert validate_qdq(out) == [] and sorted(os.listdir(str(tmp_path))) == ["q.onnx"]


def test_percentile_on_random_weights_is_a_one_line_error(small_model, tmp_path):
    images = default_images(4)
    with pytest.raises(EdgeError, match="percentile calibration failed: Too many bins") as err:
        quantize_qdq(small_model, str(tmp_path / "q.onnx"), images, PreprocessConfig(), "percentile", True,
                     show_progress=False, log=quiet)
    assert "\n" not in str(err.value) and err.value.exit_code == 1
    assert not os.path.exists(str(tmp_path / "q.onnx"))


# --- NVIDIA ModelOpt's quantizer ----------------------------------------------------------------------------------

def test_unknown_quantizer_is_one_line(small_model, tmp_path):
    why = re.escape("build.quantizer: expected one of onnxruntime|modelopt, got 'tflite'")
    with pytest.raises(EdgeError, match=why):
        quantize_qdq(small_model, str(tmp_path / "q.onnx"), None, PreprocessConfig(), quantizer="tflite")


@pytest.fixture(scope="module")
def modelopt_qdq(tiny_classifiers, tmp_path_factory):
    """ModelOpt's Q/DQ model of a tiny exported classifier, and whether the FP32 file stayed byte for byte the
    same."""
    pytest.importorskip("modelopt.onnx.quantization")
    work = tmp_path_factory.mktemp("modelopt")
    model = tiny_classifiers[0]
    before = open(model, "rb").read()
    from onnxruntime.quantization import calibrate

    original = (calibrate.create_calibrator, calibrate.MinMaxCalibrater.collect_data)
    images = default_images(8)
    out = str(work / "q.onnx")
    info = quantize_qdq(model, out, images, PreprocessConfig(), "minmax", True, show_progress=False, log=quiet,
                        quantizer="modelopt")
    # ModelOpt patches ONNX Runtime's quantizer for the whole process; quantize_qdq puts it back
    assert (calibrate.create_calibrator, calibrate.MinMaxCalibrater.collect_data) == original
    return out, info, open(model, "rb").read() == before, sorted(os.listdir(str(work)))


def test_modelopt_output_is_for_tensorrt_10_and_leaves_its_input_alone(modelopt_qdq, tiny_classifiers):
    out, info, unchanged, files = modelopt_qdq
    assert unchanged, "ModelOpt rewrote the FP32 model in place"
    assert files == ["q.onnx"]  # no intermediate files left beside the output
    assert info["quantizer"] == "modelopt" and info["opset"] == 19 and info["qdq_nodes"] > 0
    assert validate_qdq(out, "10.3.0") == []
    assert validate_qdq(out, "8.5.2") == ["opset 19 outside 13-17 (what TensorRT 8.5.2 parses)"]
    model = onnx.load(out)
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT  # not converted to fp16
    # the sensitive nodes (first Conv, classifier), handed to ModelOpt as nodes_to_exclude
    assert info["excluded_nodes"] == sensitive_nodes(onnx.load(tiny_classifiers[0])) == ["/0/Conv", "/6/Gemm"]


def test_the_nodes_kept_in_float_are_named():
    assert kept_in_float([]) == "0 nodes kept in float"
    assert kept_in_float(["/0/Conv"]) == "1 node kept in float (/0/Conv)"
    assert kept_in_float(list("abcde")) == "5 nodes kept in float (a, b, c, +2 more)"


def test_modelopt_refuses_percentile_in_one_line(small_model, tmp_path):
    pytest.importorskip("modelopt.onnx.quantization")
    why = re.escape("build.method percentile: ModelOpt calibrates with minmax|entropy only")
    with pytest.raises(EdgeError, match=why):
        quantize_qdq(small_model, str(tmp_path / "q.onnx"), None, PreprocessConfig(), "percentile",
                     quantizer="modelopt")
