"""Float fallback: when INT8 breaks a few layers, the build finds them on held-out calibration images, leaves them in
float and records why, and the gate judges the result once; when INT8 is broken everywhere (grey calibration), no
handful of float layers hides it."""

import json
import os

import numpy as np
import onnx
import pytest
import yaml
from onnx import numpy_helper
from test_build import DIGITS_GATE, cli

from edge.errors import EdgeError
from edge.model import fallback, fidelity, steps
from edge.model.calibration import load_calibration_set
from edge.model.fallback import quantized_inputs, without_quantization
from edge.model.qdq_rules import validate_qdq
from edge.store.artifact import read_model_info

# One layer's input scale shrunk a million times: every activation saturates to a step a million times too small, so
# the layer sees almost nothing whatever the image. Broken on the trunk (no residual path around it), the network
# answers one class for every image: plain INT8 fails by construction, on any machine, whatever the trained numbers.
BROKEN_SCALE = 1e-6


def trunk_layers(model):
    """The quantised convolutions every path from the input to the output runs through, in graph order."""
    consumers = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}

    def reaches_output_without(skipped):
        seen, tensors = set(), [i.name for i in model.graph.input]
        while tensors:
            tensor = tensors.pop()
            if tensor in outputs:
                return True
            for node in consumers.get(tensor, []):
                if node.name != skipped and node.name not in seen:
                    seen.add(node.name)
                    tensors.extend(node.output)
        return False

    pairs = quantized_inputs(model)
    return [n.name for n in model.graph.node
            if n.op_type == "Conv" and n.name in pairs and not reaches_output_without(n.name)]


def _middle_conv(model):
    trunk = trunk_layers(model)
    return trunk[len(trunk) // 2]


def break_one_layer(path):
    """Shrink the activation scale in front of one convolution on the trunk: a layer INT8 breaks, the rest sound."""
    model = onnx.load(path)
    victim = _middle_conv(model)
    initializers = {i.name: i for i in model.graph.initializer}
    for q, dq in quantized_inputs(model)[victim]:
        if q.input[0] not in initializers:  # the activation pair, not the weight's
            # a scale of its own: the tensor's scale is shared with the pairs in front of its other consumers
            scale = numpy_helper.to_array(initializers[q.input[1]]) * np.float32(BROKEN_SCALE)
            name = q.input[1] + "_broken"
            model.graph.initializer.append(numpy_helper.from_array(scale.astype(np.float32), name))
            q.input[1] = dq.input[1] = name
    onnx.save(model, path)
    return victim


def test_without_quantization_removes_exactly_the_pairs_in_front_of_a_layer(digits_qdq):
    model = onnx.load(digits_qdq)
    victim = _middle_conv(model)
    pairs = quantized_inputs(model)
    lighter = without_quantization(model, [victim])
    after = quantized_inputs(lighter)
    assert victim not in after and set(after) == set(pairs) - {victim}
    removed = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node) - \
        sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in lighter.graph.node)
    assert removed == 2 * len(pairs[victim])  # one Q and one DQ per input (activation, weight)
    onnx.checker.check_model(lighter)
    tmp = os.path.join(os.path.dirname(digits_qdq), "lighter.onnx")
    onnx.save(lighter, tmp)
    try:
        assert validate_qdq(tmp) == []  # still what TensorRT accepts
    finally:
        os.remove(tmp)


def _config(tmp_path, digits, **build):
    cfg = {"model": {"path": digits.onnx}, "preprocess": {"resize": 64, "crop": 64},
           "build": dict({"calibration_dir": digits.calibration, "regression_dir": digits.regression,
                          "method": "minmax", "engines_dir": str(tmp_path / "engines"), "gate": DIGITS_GATE}, **build)}
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return str(path)


def test_build_leaves_the_broken_layer_in_float_and_passes(digits, tmp_path, monkeypatch, capsys):
    real = steps.quantize
    broken = {}

    def quantize_then_break(fp32, out, *args, **kwargs):
        info = real(fp32, out, *args, **kwargs)
        broken["node"] = break_one_layer(out)
        return info

    monkeypatch.setattr(steps, "quantize", quantize_then_break)
    assert cli("build", "--config", _config(tmp_path, digits), "--no-progress") == 0
    out = capsys.readouterr().out
    assert "fallback: with every quantised layer in INT8, 32 held-out calibration images miss" in out
    assert out.count("gate: passed") == 1  # the regression set is looked at once
    manifest = read_model_info(str(tmp_path / "engines" / "digits.int8.onnx"))
    quantize = manifest["build"]["quantize"]
    floats = [r["node"] for r in quantize["float_layers"]]
    assert broken["node"] in floats and len(floats) <= 8
    assert all("why" in r and r["recovers"] > 0 for r in quantize["float_layers"][:1])
    ranked = quantize["float_layers_ranked"]  # the per-layer damage ranking, every quantised layer, worst first
    assert [r["node"] for r in ranked[:len(floats)]] == floats and len(ranked) > len(floats)
    assert [r["recovers"] for r in ranked] == sorted((r["recovers"] for r in ranked), reverse=True)
    with open(str(tmp_path / "engines" / "digits.int8.gate.json"), encoding="utf-8") as fh:
        assert json.load(fh)["float_layers_ranked"] == ranked  # in the gate report too
    assert broken["node"] in quantize["excluded_nodes"]
    cost = quantize["float_layers_cost"]
    assert 0 < cost["float_share_of_macs"] < 1 and cost["expected_engine_time_increase_pct"] > 0
    assert "not measured on a device" in cost["basis"]
    assert manifest["gate"]["passed"] is True and manifest["gate"]["looks"] == 1
    assert quantize["held_out"]["passed"] is True and quantize["held_out"]["images"] == 32
    installed = onnx.load(str(tmp_path / "engines" / "digits.int8.onnx"))
    assert broken["node"] not in quantized_inputs(installed)  # no Q/DQ in front of it: FP16 on the engine


def test_grey_calibration_is_not_hidden_by_a_few_float_layers(digits, tmp_path, capsys):
    """Grey images judge a grey calibration kindly: the fallback's held-out split is grey too. Whatever it chose, the
    gate's one look at the regression set fails the build."""
    with pytest.raises(EdgeError, match="accuracy gate failed"):
        cli("build", "--config", _config(tmp_path, digits, calibration_dir=digits.grey_calibration,
                                         max_float_layers=2), "--no-progress")
    out = capsys.readouterr().out
    assert out.count("gate: FAILED") == 1
    assert not os.path.exists(str(tmp_path / "engines" / "digits.int8.onnx"))


def test_expected_cost_counts_the_float_layers_share_of_the_work(digits):
    model = onnx.load(digits.onnx)
    compute = [n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    assert abs(fallback.compute_share(digits.onnx, compute) - 1.0) < 1e-9
    share_convs = fallback.compute_share(digits.onnx, convs)
    share_one = fallback.compute_share(digits.onnx, convs[:1])
    assert 0 < share_one < share_convs < 1.0
    assert fallback.expected_cost(digits.onnx, [])["expected_engine_time_increase_pct"] == 0


def test_the_one_session_ranking_equals_leaving_each_layer_in_float_on_its_own(digits, digits_qdq):
    images = fidelity.split(load_calibration_set(digits.calibration))[1]
    model = onnx.load(digits_qdq)
    scorer = fidelity.Fidelity(digits.onnx, images, digits.preprocess)
    ranked = fallback.rank_layers(scorer, model)
    pairs = quantized_inputs(model)
    assert {r["node"] for r in ranked} == {n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm")
                                          and n.name in pairs}
    everything = scorer.damage(model)
    for row in ranked[:2] + ranked[-1:]:
        alone = everything - scorer.damage(without_quantization(model, [row["node"]]))
        assert row["recovers"] == pytest.approx(alone, abs=5e-6)
