"""Calibration coverage: a set calibrated on dark frames and judged on bright ones is warned about, naming the
channel and the distance, in the gate's line and gate.md; sets alike are not."""

import numpy as np
import pytest

from edge.model.calibration import import_calibration_set
from edge.model.gate import GateResult
from edge.model.gate_report import markdown
from edge.model.set_coverage import WARN_LEVELS, coverage

quiet = lambda *a: None  # noqa: E731


def a_set(tmp_path, name, low, high):
    """12 noisy images with pixel values in [low, high): a night (dark) or a day (bright) scene."""
    import cv2

    raw = tmp_path / (name + "-raw")
    raw.mkdir()
    rng = np.random.default_rng(len(name))
    for i in range(12):
        cv2.imwrite(str(raw / "{:02d}.png".format(i)), rng.integers(low, high, (48, 64, 3)).astype(np.uint8))
    return import_calibration_set(str(raw), str(tmp_path / name), min_images=1, log=quiet)


@pytest.fixture
def sets(tmp_path):
    return {"night": a_set(tmp_path, "night", 0, 50), "day": a_set(tmp_path, "day", 150, 250),
            "dusk": a_set(tmp_path, "dusk", 5, 60)}


def test_a_night_camera_calibrated_on_daylight_is_warned_about(sets):
    c = coverage(sets["day"], sets["night"])
    assert min(c["distance_levels"]) > 100 > WARN_LEVELS
    assert c["mean_levels"]["calibration"][0] > 150 > 50 > c["mean_levels"]["regression"][0]
    assert c["warning"].startswith("calibration coverage: the regression images' ")
    assert "grey levels from the calibration set's" in c["warning"] and "\n" not in c["warning"]


def test_alike_sets_and_no_calibration_set_are_quiet(sets):
    c = coverage(sets["night"], sets["dusk"])
    assert max(c["distance_levels"]) < WARN_LEVELS and "warning" not in c
    assert coverage(None, sets["night"]) == {}


def test_the_warning_is_in_the_gate_line_and_gate_md(sets):
    c = coverage(sets["day"], sets["night"])
    report = {"mean_cosine": 1.0, "p5_cosine": 1.0, "confident_flips": 0, "confident_images": 0, "agreement": 1.0,
              "claims": [], "warnings": [c["warning"]], "calibration_coverage": c, "verdict": "pass"}
    assert GateResult(report).summary().endswith("; " + c["warning"])
    md = markdown(report)
    assert "## Warnings" in md and "Calibration coverage: colour distance B, G, R" in md
