"""edge.model.fidelity: the distance from FP32 is measured on the held-out split of the calibration set only, a split
that grows with the set."""

import numpy as np

from edge.model import fidelity
from edge.model.calibration import CalibrationSet, load_calibration_set


def test_fidelity_reads_the_held_out_calibration_images_only(digits, digits_qdq, monkeypatch):
    read = []
    images = load_calibration_set(digits.calibration)
    calibrate_on, held_out = fidelity.split(images)
    assert len(held_out) == 32 and len(calibrate_on) == 32 and not set(held_out.files) & set(calibrate_on.files)
    monkeypatch.setattr(held_out, "read", lambda name: read.append(name) or np.zeros((64, 64, 3), np.uint8))
    fidelity.Fidelity(digits.onnx, held_out, digits.preprocess)
    assert read == held_out.files


def test_the_held_out_split_grows_with_the_set():
    for count, held in ((10, 5), (64, 32), (128, 64), (500, 125)):
        images = CalibrationSet("x", ["{:04d}.jpg".format(i) for i in range(count)], "0" * 64)
        calibrate_on, held_out = fidelity.split(images)
        assert len(held_out) == held and len(calibrate_on) == count - held
