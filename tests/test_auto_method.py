"""`build.method: auto`: every candidate method calibrates on part of the calibration set, the one closest to FP32 on
the held-out part is chosen and calibrates on the whole set."""

import os

import onnx
import pytest
from test_build import cli, digits_build_config

from edge.errors import EdgeError
from edge.model import auto_method
from edge.model.calibration import load_calibration_set
from edge.model.fidelity import Fidelity, split
from edge.store.artifact import read_model_info

CHEAP = {"onnxruntime": ("minmax", "percentile")}  # entropy alone takes ~20 s on the digits model


def test_auto_chooses_on_held_out_images_then_calibrates_on_all(digits, tmp_path, monkeypatch):
    monkeypatch.setattr(auto_method, "CANDIDATES", CHEAP)
    images = load_calibration_set(digits.calibration)
    calibrate_on, held_out = split(images)
    calibrated = []
    real = auto_method.quantize_qdq
    monkeypatch.setattr(auto_method, "quantize_qdq", lambda fp32, out, imgs, *a: calibrated.append(
        (imgs.files, a[1])) or real(fp32, out, imgs, *a))
    out, lines = str(tmp_path / "m.onnx"), []
    summary = auto_method.quantize(digits.onnx, out, images, digits.preprocess, "auto", show_progress=False,
                                   log=lines.append)
    damage = {m: r["damage"] for m, r in summary["candidates"].items()}
    assert set(damage) == {"minmax", "percentile"} and damage["minmax"] != damage["percentile"]
    assert summary["chosen_by"] == "auto" and summary["method"] == min(damage, key=damage.get)
    # each candidate saw only the calibration part; the chosen one then calibrated on the whole set
    assert calibrated == [(calibrate_on.files, "minmax"), (calibrate_on.files, "percentile"),
                          (images.files, summary["method"])]
    assert summary["chosen_on"] == {"calibrated_on": 32, "held_out": 32} and summary["images"] == 64
    # sound INT8 of the digits model: damage ~4e-4 measured (mean cosine 0.9996), a hundred times below this bound
    scorer = Fidelity(digits.onnx, held_out, digits.preprocess)
    assert 0 < scorer.damage(onnx.load(out)) < 0.05
    assert len(lines) == 1 and "auto: " + summary["method"] in lines[0] and "32 held-out" in lines[0]
    assert os.listdir(str(tmp_path)) == ["m.onnx"]  # the other candidate and the work folder are gone


def test_a_method_that_fails_is_skipped_and_reported(digits, tmp_path, monkeypatch):
    monkeypatch.setattr(auto_method, "CANDIDATES", CHEAP)
    real = auto_method.quantize_qdq

    def percentile_fails(fp32, out, images, preprocess, method, *args):
        if method == "percentile":  # as on random weights: numpy's "Too many bins for data range"
            raise EdgeError("{}: percentile calibration failed: Too many bins for data range".format(fp32))
        return real(fp32, out, images, preprocess, method, *args)

    monkeypatch.setattr(auto_method, "quantize_qdq", percentile_fails)
    summary = auto_method.quantize(digits.onnx, str(tmp_path / "m.onnx"), load_calibration_set(digits.calibration),
                                   digits.preprocess, "auto", show_progress=False, log=lambda *a: None)
    error = summary["candidates"]["percentile"]["error"]
    assert summary["method"] == "minmax" and "Too many bins" in error
    assert error.startswith("digits.onnx: ") and os.path.dirname(digits.onnx) not in error  # manifests keep no path


def test_when_every_method_fails_the_first_error_is_the_build_error(digits, tmp_path, monkeypatch):
    monkeypatch.setattr(auto_method, "CANDIDATES", CHEAP)

    def fails(fp32, out, images, preprocess, method, *args):
        raise EdgeError("{} calibration failed".format(method))

    monkeypatch.setattr(auto_method, "quantize_qdq", fails)
    with pytest.raises(EdgeError, match="^minmax calibration failed$"):
        auto_method.quantize(digits.onnx, str(tmp_path / "m.onnx"), load_calibration_set(digits.calibration),
                             digits.preprocess, "auto", show_progress=False, log=lambda *a: None)
    assert os.listdir(str(tmp_path)) == []


def test_the_build_records_what_auto_chose(digits, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(auto_method, "CANDIDATES", CHEAP)
    assert cli("build", "--config", digits_build_config(tmp_path, digits, method="auto"), "--no-progress") == 0
    manifest = read_model_info(str(tmp_path / "engines" / "digits.int8.onnx"))
    quantize = manifest["build"]["quantize"]
    assert manifest["calibration"]["method"] == "auto"  # what the config asked: a rebuild compares this
    assert quantize["chosen_by"] == "auto" and quantize["method"] in CHEAP["onnxruntime"]
    assert set(quantize["candidates"]) == set(CHEAP["onnxruntime"])
    assert "onnxruntime auto: " + quantize["method"] in capsys.readouterr().out
