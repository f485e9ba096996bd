"""The regression set without the images the calibration set also holds (the same bytes: both manifests list each
file's sha256). An image the model was calibrated on (or whose held-out half chose the float fallback) tells nothing
about the images it was not: the gate leaves it out and says how many; with nothing left it refuses.
"""

from dataclasses import replace
from typing import Dict, Optional, Tuple

from edge.errors import EdgeError
from edge.model.calibration import CalibrationSet


def file_hashes(images: CalibrationSet) -> Dict[str, str]:
    """name -> sha256 from the set's manifest."""
    return {str(e["name"]): str(e["sha256"]) for e in images.manifest.get("files", [])}


def without_calibration(regression: CalibrationSet, calibration: Optional[CalibrationSet],
                        ) -> Tuple[CalibrationSet, int]:
    """(the regression set less the images also in `calibration`, how many were left out). The result keeps the
    regression set's sha256: it names the labelled set the looks are counted on."""
    if calibration is None:
        return regression, 0
    seen = set(file_hashes(calibration).values())
    hashes = file_hashes(regression)
    kept = [name for name in regression.files if hashes.get(name) not in seen]
    dropped = len(regression.files) - len(kept)
    if dropped and not kept:
        raise EdgeError("{}: every one of its {} images is also in the calibration set {}: the gate needs images "
                        "the model was not calibrated on (build.regression_dir)".format(
                            regression.root, dropped, calibration.root))
    return (replace(regression, files=kept) if dropped else regression), dropped
