"""Whether the calibration set looks like the images the model is judged on: INT8's ranges are set on the
calibration images, and a night camera calibrated on daylight photos clips or wastes them.

Per channel (B, G, R), each set's pooled histogram of pixel values (every image shrunk to SIDE x SIDE, each weighing
the same) and the distance between the two sets' histograms: the 1-D earth mover's distance in grey levels (0-255),
how far the pixel values would have to move on average. Above WARN_LEVELS on any channel the gate warns, in its line
and its report (`calibration_coverage`); it never fails on it: the gate's own claims judge the result.
"""

from typing import Any, Dict, List, Optional

import numpy as np

from edge.errors import require
from edge.model.calibration import CalibrationSet

SIDE = 32
BINS = 64  # of 4 grey levels
WARN_LEVELS = 40.0  # grey levels; measured: calibration/default vs the labelled ImageNet set ~16, dark vs bright ~150
CHANNELS = "BGR"


def histograms(images: CalibrationSet, names: Optional[List[str]] = None) -> np.ndarray:
    """3 x BINS: each channel's share of pixels per bin over `names` (default: every image)."""
    cv2 = require("cv2")
    total = np.zeros((3, BINS), np.float64)
    for name in images.files if names is None else names:
        small = cv2.resize(images.read(name), (SIDE, SIDE), interpolation=cv2.INTER_AREA).reshape(-1, 3)
        for channel in range(3):
            total[channel] += np.bincount(small[:, channel] >> 2, minlength=BINS) / len(small)
    return total / max(total[0].sum(), 1e-12)


def coverage(calibration: Optional[CalibrationSet], regression: CalibrationSet) -> Dict[str, Any]:
    """The distance per channel, both sets' mean levels and, above WARN_LEVELS, the warning; {} without a
    calibration set."""
    if calibration is None or not len(calibration) or not len(regression):
        return {}
    cal, reg = histograms(calibration), histograms(regression)
    width = 256.0 / BINS
    distance = [round(float(np.abs(np.cumsum(cal[c] - reg[c])).sum() * width), 2) for c in range(3)]
    centres = (np.arange(BINS) + 0.5) * width
    means = {"calibration": [round(float(cal[c] @ centres), 1) for c in range(3)],
             "regression": [round(float(reg[c] @ centres), 1) for c in range(3)]}
    out: Dict[str, Any] = {"distance_levels": distance, "mean_levels": means, "warn_levels": WARN_LEVELS}
    worst = int(np.argmax(distance))
    if distance[worst] > WARN_LEVELS:
        out["warning"] = (
            "calibration coverage: the regression images' {} channel sits {:.0f} grey levels from the calibration "
            "set's (mean {:.0f} against {:.0f}; warned above {:g}): INT8's ranges were set on other light than the "
            "images judged (a night camera calibrated on daylight photos?); calibrate on frames like these".format(
                CHANNELS[worst], distance[worst], means["regression"][worst], means["calibration"][worst],
                WARN_LEVELS))
    return out
