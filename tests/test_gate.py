"""The accuracy gate on a model that has learned something: a sound INT8 model passes, broken ones fail."""

import dataclasses
import json

import numpy as np
import pytest

from edge.build.calibration import CalibrationSet, load_calibration_set
from edge.build.gate import enforce, evaluate, resolve_labels, write_report
from edge.build.quantize import quantize_qdq
from edge.config import GateConfig
from edge.errors import EdgeError
from edge.frame.onnxruntime_backend import OnnxRuntimeBackend

from trained_model import digits, digits_qdq  # noqa: F401  (session fixtures)

LABELS = [str(i) for i in range(10)]
quiet = lambda *a: None  # noqa: E731


@pytest.fixture(scope="module")
def reference(digits):  # noqa: F811
    with OnnxRuntimeBackend(digits.onnx) as backend:
        yield backend.infer


def gate(digits, reference, candidate_path, **thresholds):  # noqa: F811
    with OnnxRuntimeBackend(candidate_path) as candidate:
        return evaluate(reference, candidate.infer, load_calibration_set(digits.regression), digits.preprocess,
                        GateConfig(**thresholds), LABELS)


def test_sound_int8_passes(digits, digits_qdq, reference):  # noqa: F811
    result = gate(digits, reference, digits_qdq)
    r = result.report
    assert result.passed and r["failures"] == []
    assert r["samples"] == r["labelled"] == 297
    assert r["agreement"] >= 0.98 and r["mean_cosine"] >= 0.99 and r["top1_drop_pp"] <= 1.0
    # The FP32 reference through the runtime's preprocessing scores what torch scored in training.
    assert abs(r["reference_top1"] - digits.torch_top1) <= 1 / 297 + 1e-9
    assert len(r["flips"]) == round((1 - r["agreement"]) * 297)
    assert 0.0 < r["min_cosine"] <= r["mean_cosine"] <= 1.0


def test_grey_calibration_fails_with_reasons_and_report(digits, reference, tmp_path):  # noqa: F811
    broken = str(tmp_path / "grey.onnx")
    quantize_qdq(digits.onnx, broken, load_calibration_set(digits.grey_calibration), digits.preprocess, "minmax",
                 False, show_progress=False, log=quiet)
    result = gate(digits, reference, broken)
    r = result.report
    assert not result.passed
    assert r["agreement"] < 0.9 and r["mean_cosine"] < 0.95 and r["top1_drop_pp"] > 5
    assert any(f.startswith("top-1 agreement") for f in r["failures"])
    assert any(f.startswith("mean logit cosine") for f in r["failures"])
    assert any(f.startswith("top-1 accuracy drop") for f in r["failures"])
    flip = r["flips"][0]
    assert set(flip) == {"file", "reference", "candidate", "label", "cosine"} and flip["reference"] != flip["candidate"]
    assert flip["label"] == flip["file"].split("/")[0]
    report = str(tmp_path / "gate.json")
    write_report(report, result, {"artifact": "x"})
    saved = json.load(open(report))
    assert saved["passed"] is False and saved["artifact"] == "x" and len(saved["flips"]) == len(r["flips"])
    with pytest.raises(EdgeError, match="accuracy gate failed: top-1 agreement") as err:
        enforce(result, report)
    assert err.value.exit_code == 1 and report in str(err.value) and "\n" not in str(err.value)


def test_unnormalised_calibration_fails(digits, reference, tmp_path):  # noqa: F811
    raw = dataclasses.replace(digits.preprocess, mean=[0.0] * 3, std=[1 / 255.0] * 3)  # 0-255 inputs
    broken = str(tmp_path / "raw.onnx")
    quantize_qdq(digits.onnx, broken, load_calibration_set(digits.calibration), raw, "minmax", True,
                 show_progress=False, log=quiet)
    r = gate(digits, reference, broken).report
    assert not r["passed"] and r["agreement"] < 0.5


def test_metrics_are_exact_on_a_known_candidate(digits, reference):  # noqa: F811
    """A candidate that swaps the top-2 logits on exactly 3 images: agreement and flips must say 3."""
    s = load_calibration_set(digits.regression)
    targets = set(s.files[::100])
    current = {}

    def read(name, _read=s.read):
        current["name"] = name
        return _read(name)

    s.read = read  # note which image each tensor came from

    def candidate(tensor):
        out = reference(tensor).copy()
        if current["name"] in targets:
            order = np.argsort(-out[0])
            out[0, order[0]], out[0, order[1]] = out[0, order[1]], out[0, order[0]]
        return out

    r = evaluate(reference, candidate, s, digits.preprocess, GateConfig(min_agreement=0.99), LABELS).report
    assert len(targets) == 3 and len(r["flips"]) == 3
    assert r["agreement"] == round(294 / 297, 6) and not r["passed"]
    assert {f["file"] for f in r["flips"]} == targets
    assert "top-1 agreement 0.9899 < 0.99" in r["failures"]


def test_unlabelled_set_judges_agreement_and_cosine_only(digits, reference, tmp_path):  # noqa: F811
    s = load_calibration_set(digits.calibration)
    r = evaluate(reference, reference, s, digits.preprocess, GateConfig()).report
    assert r["passed"] and r["labelled"] == 0 and "top1_drop_pp" not in r
    assert r["agreement"] == 1.0 and r["mean_cosine"] == pytest.approx(1.0)


def test_labels_from_subfolders_by_name_or_index(digits):  # noqa: F811
    s = load_calibration_set(digits.regression)
    truth = resolve_labels(s, LABELS)
    assert truth == [int(name.split("/")[0]) for name in s.files]
    assert resolve_labels(s, None) == truth  # class indices when there is no labels file
    renamed = CalibrationSet(s.root, ["cat/0001.png"], s.sha256)
    with pytest.raises(EdgeError, match="subfolder 'cat' is neither a label"):
        resolve_labels(renamed, LABELS)
