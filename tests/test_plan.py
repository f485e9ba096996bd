"""edge.model.plan: every input of a build is checked before any work, in one line naming its field, and the target
TensorRT limits the source model's opset up front."""

import json
import os
import shutil

import onnx
import pytest
from test_build import digits_build_config

from edge.config import load_config
from edge.errors import EdgeError
from edge.model.export import sha256_file
from edge.model.plan import check_inputs, source_model


def test_inputs_are_checked_up_front_naming_the_field(digits, tmp_path):
    def refused(match, engine=False, calibrator=False, **overrides):
        cfg = load_config(digits_build_config(tmp_path, digits), overrides)
        with pytest.raises(EdgeError, match=match):
            check_inputs(cfg, engine=engine, calibrator=calibrator)

    refused(r"input shape \[1, 3, 64, 64\] does not match preprocess.crop 224", **{"preprocess.resize": 256,
                                                                                  "preprocess.crop": 224})
    refused("build.precision fp16 .*need --engine", **{"build.precision": "fp16"})
    refused(r"calibration set \(build.calibration_dir in .*edge.yaml\) not found",
            **{"build.calibration_dir": str(tmp_path / "nowhere")})
    refused(r"regression set \(build.regression_dir", **{"build.regression_dir": str(tmp_path / "nowhere")})
    refused("source model not found", **{"model.path": str(tmp_path / "missing.onnx")})
    refused("--calibrator: TensorRT calibration applies to INT8 engines only", calibrator=True)
    refused("no TensorRT runtime", engine=True)
    assert source_model("engines/m.int8.engine") == "engines/m.onnx"
    assert source_model("engines/m.onnx") == "engines/m.onnx"
    refused(r"build.target_tensorrt 'eight' in .*edge.yaml: expected MAJOR.MINOR", **{"build.target_tensorrt": "eight"})


def test_the_target_tensorrt_limits_the_opset_before_any_work(digits, tmp_path):
    """TensorRT 8.5/8.6 parse opset 17 at most: an opset-18 export is refused up front for JetPack 5, not by the
    device's parser after calibration."""
    model = onnx.load(digits.onnx)
    model.opset_import[0].version = 18
    newer = str(tmp_path / "digits18.onnx")
    onnx.save(model, newer)
    info = json.load(open(os.path.splitext(digits.onnx)[0] + ".json", encoding="utf-8"))
    info["sha256"] = sha256_file(newer)  # the model info of the edited model (a stale one is refused first)
    (tmp_path / "digits18.json").write_text(json.dumps(info), encoding="utf-8")
    shutil.copyfile(os.path.splitext(digits.onnx)[0] + ".labels.txt", str(tmp_path / "digits18.labels.txt"))
    cfg = load_config(digits_build_config(tmp_path, digits), {"build.target_tensorrt": "8.5"})
    with pytest.raises(EdgeError, match=r"digits18.onnx: opset 18, INT8 Q/DQ for TensorRT 8.5 needs 13-17"):
        check_inputs(cfg, newer)
    plan = check_inputs(load_config(digits_build_config(tmp_path, digits), {"build.target_tensorrt": "10.3"}), newer)
    assert plan.target_tensorrt == "10.3"
