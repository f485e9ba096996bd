"""edge.infer.stages: config -> the loaded stages of one model, with what was chosen and why; what they say about the
model is captured at load, whatever happens to its files after."""

import hashlib
import json
import shutil

import numpy as np
import pytest
from test_preprocess import EFFNET

from edge.config import load_config
from edge.errors import EdgeError
from edge.infer.preprocess import CpuPreprocessor, FastPreprocessor
from edge.infer.stages import build_stages, create_stages


def test_build_stages_feeds_the_model_its_own_constants(small_model, tmp_path):
    """Every command's stages (CPU preprocessor, and the config the CUDA one would get) use the model info's."""
    model = str(tmp_path / "m.onnx")
    shutil.copy(small_model, model)
    shutil.copy(small_model[:-5] + ".labels.txt", str(tmp_path / "m.labels.txt"))
    info = json.load(open(small_model[:-5] + ".json", encoding="utf-8"))
    info["preprocess"] = EFFNET
    (tmp_path / "m.json").write_text(json.dumps(info), encoding="utf-8")
    seen = []

    def factory(cfg):
        seen.append(cfg.preprocess)
        return create_stages(cfg)

    stages = build_stages(load_config(None, {"model.path": model, "preprocess.device": "cpu"}), factory)
    try:
        assert seen[0].mean == EFFNET["mean"] and stages.preprocess.cfg.std == EFFNET["std"]
        frame = np.full((240, 320, 3), 127, np.uint8)
        assert np.allclose(stages.preprocess(frame), 0.0, atol=1e-6)  # (127 - 127) / 128
    finally:
        stages.close()
    with pytest.raises(EdgeError, match="'preprocess.mean' is .* trained with"):
        build_stages(load_config(None, {"model.path": model, "preprocess.mean": [0.5, 0.5, 0.5]}))


def test_the_service_preprocesses_fast_unless_told_exact(tiny_classifiers):
    for choice, kind in (({}, FastPreprocessor), ({"preprocess.cpu": "exact"}, CpuPreprocessor)):
        stages = build_stages(load_config(None, dict({"model.path": tiny_classifiers[0]}, **choice)))
        try:
            assert type(stages.preprocess) is kind and stages.preprocess_name == "cpu"
        finally:
            stages.close()


def test_what_the_stages_say_is_the_model_loaded_whatever_happens_to_its_files_after(small_model, tmp_path):
    for suffix in (".onnx", ".labels.txt", ".json"):
        shutil.copy(small_model[:-5] + suffix, str(tmp_path / ("m" + suffix)))
    model = str(tmp_path / "m.onnx")
    loaded = hashlib.sha256((tmp_path / "m.onnx").read_bytes()).hexdigest()
    stages = build_stages(load_config(None, {"model.path": model, "preprocess.device": "cpu"}))
    try:
        before = stages.facts()
        (tmp_path / "m.onnx").write_bytes(b"replaced")
        (tmp_path / "m.json").write_text(json.dumps({"trained": True, "weights": "other"}), encoding="utf-8")
        assert stages.facts() == before and before["sha256"] == stages.sha256 == loaded
        assert before["weights"] != "other"
        stage_ms = {}
        prediction = stages.classify(np.zeros((240, 320, 3), np.uint8), stage_ms)
        assert len(prediction.indices) == 5 and {"preprocess", "infer", "postprocess"} <= set(stage_ms)
    finally:
        stages.close()
