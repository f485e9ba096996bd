"""The regression set without the images the calibration set also holds: the same bytes (both manifests list each
file's sha256), or a near-duplicate (a resized or re-encoded copy: its 16x16 grey thumbnail within capture's
min_diff of a calibration image's, edge.model.calibration.thumbnail). An image the model was calibrated on (or whose
held-out half chose the float fallback) tells nothing about the images it was not: the gate leaves it out and says
how many; with nothing left it refuses.
"""

from dataclasses import replace
from typing import Dict, List, Optional, Tuple

import numpy as np

from edge.errors import EdgeError
from edge.model.calibration import CalibrationSet, nearest_difference, thumbnail
from edge.model.capture_options import DEFAULT_MIN_DIFF


def file_hashes(images: CalibrationSet) -> Dict[str, str]:
    """name -> sha256 from the set's manifest."""
    return {str(e["name"]): str(e["sha256"]) for e in images.manifest.get("files", [])}


def _near_duplicates(regression: CalibrationSet, names: List[str], calibration: CalibrationSet) -> List[str]:
    """The images of `names` whose thumbnail is within DEFAULT_MIN_DIFF of a calibration image's."""
    thumbs = np.stack([thumbnail(image) for image in calibration.images()]) if len(calibration) else np.zeros(0)
    return [name for name in names if nearest_difference(thumbs, thumbnail(regression.read(name))) < DEFAULT_MIN_DIFF]


def without_calibration(regression: CalibrationSet, calibration: Optional[CalibrationSet],
                        ) -> Tuple[CalibrationSet, int, int]:
    """(the regression set less the images also in `calibration`, how many were left out, how many of them were
    near-duplicates rather than the same bytes). The result keeps the regression set's sha256: it names the
    labelled set the looks are counted on."""
    if calibration is None:
        return regression, 0, 0
    seen = set(file_hashes(calibration).values())
    hashes = file_hashes(regression)
    kept = [name for name in regression.files if hashes.get(name) not in seen]
    near = set(_near_duplicates(regression, kept, calibration))
    kept = [name for name in kept if name not in near]
    dropped = len(regression.files) - len(kept)
    if dropped and not kept:
        raise EdgeError("{}: every one of its {} images is also in the calibration set {} (the same or nearly the "
                        "same image): the gate needs images the model was not calibrated on (build.regression_dir)"
                        .format(regression.root, dropped, calibration.root))
    return (replace(regression, files=kept) if dropped else regression), dropped, len(near)
