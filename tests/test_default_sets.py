"""edge.model.default_sets: the shipped default and regression calibration sets are valid, small, disjoint and
made again the same from their sources."""

import os

import numpy as np

from edge.model.calibration import load_calibration_set
from edge.model.default_sets import make_default_sets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_shipped_default_sets_are_valid_small_disjoint_and_reproducible(tmp_path):
    default = load_calibration_set(os.path.join(REPO, "calibration", "default"), min_images=32)
    regression = load_calibration_set(os.path.join(REPO, "calibration", "regression"))
    assert len(default) == 64 and len(regression) == 100
    hashes = lambda s: {e["sha256"] for e in s.manifest["files"]}  # noqa: E731
    assert not hashes(default) & hashes(regression)
    total = 0
    for s in (default, regression):
        for e in s.manifest["files"]:
            assert max(e["width"], e["height"]) <= 640
            total += os.path.getsize(s.path(e["name"]))
    assert total < 3e6
    assert os.path.isfile(os.path.join(REPO, "calibration", "README.md"))
    new_default, new_regression = make_default_sets(str(tmp_path), log=lambda *a: None)
    for shipped, new in ((default, new_default), (regression, new_regression)):
        assert new.files == shipped.files
        for name in shipped.files[::7]:  # same pixels up to libjpeg differences between OpenCV builds
            a, b = shipped.read(name).astype(int), new.read(name).astype(int)
            assert a.shape == b.shape and np.abs(a - b).mean() < 1.0, name
