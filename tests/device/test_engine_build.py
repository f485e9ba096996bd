"""On the device: `edge build --engine` end to end on the trained digits model (tests/trained_model.py).

Explicit Q/DQ INT8 (TensorRT 8.5-11), FP16, and the implicit entropy calibrator with its cache (8.5/10.x).
Skipped with the reason where TensorRT, pycuda or a CUDA device is missing (tests/device/conftest.py).
"""

import os
import shutil

import pytest
import yaml

from edge.config import load_config
from edge.model.plan import check_inputs
from edge.model.steps import run_build
from edge.model.trt_cache import read_trt_calibration_cache
from edge.store.artifact import check_engine, read_model_info

pytestmark = [pytest.mark.jetson, pytest.mark.tensorrt]


def tensorrt_major():
    import tensorrt as trt

    return int(trt.__version__.split(".")[0])


def build(digits, tmp_path, engine=True, calibrator=False, **build_keys):
    calibration = tmp_path / "calibration" / "set"
    if not calibration.exists():
        shutil.copytree(digits.calibration, str(calibration))
    cfg_path = tmp_path / "edge.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "model": {"path": digits.onnx}, "preprocess": {"resize": 64, "crop": 64},
        "build": dict({"calibration_dir": str(calibration), "regression_dir": digits.regression,
                       "engines_dir": str(tmp_path / "engines")}, **build_keys)}), encoding="utf-8")
    lines = []
    plan = check_inputs(load_config(str(cfg_path)), engine=engine, calibrator=calibrator, show_progress=False)
    manifest = run_build(plan, lines.append)
    return plan.artifact, manifest, lines


def test_int8_engine_from_qdq_passes_the_gate_and_is_tied_to_this_device(gpu, digits, tmp_path):
    import tensorrt as trt

    artifact, manifest, _ = build(digits, tmp_path)
    assert artifact.endswith("digits.int8.engine") and os.path.getsize(artifact) > 0
    assert manifest["format"] == "tensorrt-engine" and manifest["build"]["engine"]["mode"] == "int8-explicit-qdq"
    assert manifest["system"]["tensorrt"] == trt.__version__ and manifest["system"]["gpu"]
    assert manifest["gate"]["enforced"] is True and manifest["gate"]["passed"] is True
    assert check_engine(artifact)["sha256"] == manifest["sha256"]
    timing = manifest["build"]["engine"]["timing_cache"]
    assert os.path.getsize(timing) > 0
    build(digits, tmp_path)  # a second build reads the timing cache and keeps the first in previous/
    assert os.path.isfile(os.path.join(str(tmp_path / "engines"), "previous", "digits.int8.engine"))


def test_fp16_engine(gpu, digits, tmp_path):
    if tensorrt_major() >= 11:
        pytest.skip("TensorRT 11 has no FP16 builder flag (strongly typed networks only)")
    artifact, manifest, _ = build(digits, tmp_path, precision="fp16")
    assert artifact.endswith("digits.fp16.engine") and manifest["calibration"] is None
    assert manifest["gate"]["passed"] is True and manifest["gate"]["agreement"] >= 0.99


def test_implicit_calibrator_writes_its_cache_and_a_rebuild_skips_calibration(gpu, digits, tmp_path):
    if tensorrt_major() >= 11:
        pytest.skip("TensorRT 11 removed implicit INT8 calibration")
    _, manifest, lines = build(digits, tmp_path, calibrator=True)
    assert manifest["build"]["engine"]["mode"] == "int8-implicit-entropy2"
    assert manifest["calibration"]["method"] == "tensorrt-entropy2"
    caches = [n for n in os.listdir(str(tmp_path / "calibration" / "cache")) if n.endswith(".cache")]
    assert len(caches) == 1 and caches[0].startswith(read_model_info(digits.onnx)["sha256"][:12] + "-trt")
    with open(str(tmp_path / "calibration" / "cache" / caches[0]), "rb") as fh:
        _, algorithm, scales = read_trt_calibration_cache(fh.read())
    assert algorithm == "EntropyCalibration2" and "input" in scales
    assert not any("calibration skipped" in line for line in lines)
    _, _, lines = build(digits, tmp_path, calibrator=True)
    assert any("calibration skipped" in line for line in lines)
