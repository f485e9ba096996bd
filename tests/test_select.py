"""edge.infer.select: which preprocessor and backend run, and the engine fallback. An engine this machine cannot
serve (not built yet, built for another board, TensorRT or CUDA, or no GPU path) is replaced, under `backend.kind:
auto`, by the ONNX of its folder on the CPU, degraded and saying why, while jetson-edge-engine.service builds the
engine; `edge build --needed` is that unit's condition. This machine has no TensorRT: every engine here is one it
cannot serve."""

import shutil

import pytest
from service_helpers import write_config

from edge.config import load_config
from edge.errors import EdgeError
from edge.infer.select import ENGINE_UNIT, engine_fallback
from edge.infer.stages import build_stages

from conftest import edge_here


def install_as(model, folder, name):
    """The exported model's set (model, labels, model info) copied into `folder` under the stem `name`."""
    for suffix in (".onnx", ".labels.txt", ".json"):
        shutil.copy(model[:-len(".onnx")] + suffix, str(folder / (name + suffix)))
    return str(folder / (name + ".onnx"))


def config(tmp_path, kind="auto"):
    return load_config(write_config(tmp_path / "edge.yaml", {
        "model": {"path": str(tmp_path / "m.int8.engine")}, "backend": {"kind": kind}}))


def test_an_engine_not_built_yet_is_served_from_its_folders_onnx_on_the_cpu_degraded(tiny_classifiers, tmp_path):
    fp32 = install_as(tiny_classifiers[0], tmp_path, "m")
    found = engine_fallback(config(tmp_path))
    assert found is not None and found[0] == fp32
    assert "engine m.int8.engine not built yet" in found[1] and ENGINE_UNIT in found[1]
    int8 = install_as(tiny_classifiers[1], tmp_path, "m.int8")  # the gate-judged INT8 ONNX comes first
    stages = build_stages(config(tmp_path))
    try:
        assert stages.model_path == int8 and stages.description["backend"] == "onnxruntime"
        assert stages.degraded and "serving m.int8.onnx on the CPU" in stages.degraded
        assert stages.facts()["degraded"] == stages.degraded
    finally:
        stages.close()


def test_an_engine_this_machine_cannot_run_is_replaced_and_one_it_can_is_not(tiny_classifiers, tmp_path,
                                                                             monkeypatch):
    install_as(tiny_classifiers[0], tmp_path, "m")
    (tmp_path / "m.int8.engine").write_bytes(b"an engine for another board")
    found = engine_fallback(config(tmp_path))
    assert found is not None and "tensorrt not importable" in found[1]  # no GPU path here
    monkeypatch.setattr("edge.infer.select.gpu_unavailable", lambda: None)
    found = engine_fallback(config(tmp_path))  # a GPU path, but no model info: the engine check refuses it
    assert found is not None and "rebuild with" not in found[1] and "m.int8.engine" in found[1]
    monkeypatch.setattr("edge.infer.select.check_engine", lambda path: {})
    assert engine_fallback(config(tmp_path)) is None  # it fits: served as it is


def test_no_fallback_without_auto_or_without_an_onnx_to_serve(tiny_classifiers, tmp_path):
    assert engine_fallback(config(tmp_path)) is None  # nothing to serve instead: the engine's own error stands
    with pytest.raises(EdgeError, match="m.int8.engine"):
        build_stages(config(tmp_path))
    install_as(tiny_classifiers[0], tmp_path, "m")
    assert engine_fallback(config(tmp_path, kind="tensorrt")) is None  # an explicit choice is not overridden


def test_build_needed_is_the_engine_units_condition(tiny_classifiers, tmp_path):
    proc = edge_here("build", "--engine", "--needed", "--config", str(config(tmp_path).path))
    assert proc.returncode == 0 and "build: needed:" in proc.stdout, proc.stdout + proc.stderr
    onnx = install_as(tiny_classifiers[0], tmp_path, "m")
    proc = edge_here("build", "--engine", "--needed", "--model", onnx)
    assert proc.returncode == 1 and "not a TensorRT engine: nothing to build" in proc.stdout
