"""The regression set less the calibration set's images: the same bytes, and near-duplicates (a resized, re-encoded
copy) by capture's 16x16 grey thumbnail; a different photo stays."""

import os
import shutil

import cv2
import pytest

from edge.errors import EdgeError
from edge.model.calibration import import_calibration_set, load_calibration_set
from edge.model.set_overlap import without_calibration

quiet = lambda *a: None  # noqa: E731
DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "calibration", "default")


@pytest.fixture
def calibration(tmp_path):
    raw = tmp_path / "calibration-raw"
    raw.mkdir()
    for name in ("astronaut-00.jpg", "astronaut-01.jpg", "coffee-00.jpg", "coffee-01.jpg"):
        shutil.copy(os.path.join(DEFAULT, name), str(raw / name))
    return import_calibration_set(str(raw), str(tmp_path / "calibration"), min_images=1, log=quiet)


def regression_of(tmp_path, files):
    raw = tmp_path / "regression-raw"
    (raw / "0").mkdir(parents=True)
    for name, data in files.items():
        (raw / name).write_bytes(data)
    return import_calibration_set(str(raw), str(tmp_path / "regression"), min_images=1, log=quiet)


def test_a_resized_re_encoded_copy_is_left_out_and_a_different_photo_is_not(calibration, tmp_path):
    photo = cv2.imread(os.path.join(DEFAULT, "astronaut-00.jpg"))
    ok, copy = cv2.imencode(".jpg", cv2.resize(photo, None, fx=0.6, fy=0.6, interpolation=cv2.INTER_AREA),
                            [cv2.IMWRITE_JPEG_QUALITY, 60])
    with open(os.path.join(DEFAULT, "coffee-00.jpg"), "rb") as fh:
        same = fh.read()
    with open(os.path.join(DEFAULT, "rocket-00.jpg"), "rb") as fh:
        other = fh.read()
    regression = regression_of(tmp_path, {"0/copy.jpg": copy.tobytes(), "0/same.jpg": same, "0/other.jpg": other})
    kept, dropped, near = without_calibration(regression, calibration)
    assert kept.files == ["0/other.jpg"] and (dropped, near) == (2, 1)
    assert kept.sha256 == regression.sha256  # the looks are counted on the set as labelled


def test_nothing_left_is_refused_and_no_calibration_set_drops_nothing(calibration, tmp_path):
    photo = cv2.imread(os.path.join(DEFAULT, "coffee-01.jpg"))
    ok, copy = cv2.imencode(".png", photo[1:, 1:])  # one pixel cropped off: other bytes, the same photo
    regression = regression_of(tmp_path, {"0/copy.png": copy.tobytes()})
    assert without_calibration(regression, None) == (regression, 0, 0)
    with pytest.raises(EdgeError, match="every one of its 1 images is also in the calibration set .* nearly the same"):
        without_calibration(load_calibration_set(regression.root), calibration)
