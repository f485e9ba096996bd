"""The default calibration and regression sets shipped in calibration/, regenerated from scikit-image's sample
photographs (scripts/make_default_calibration.py)."""

import os
from typing import Callable, List, Tuple

import numpy as np

from edge.errors import EdgeError, require
from edge.model.calibration import MANIFEST, MIN_SIDE, CalibrationSet, SetWriter
from edge.store.fileio import atomic_dir

# scikit-image sample photographs (licences quoted in calibration/README.md).
CALIBRATION_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "camera", "coins", "brick", "grass")
HELD_OUT_PHOTOS = ("hubble_deep_field", "immunohistochemistry", "clock", "retina")


def _skimage_photo(name: str) -> np.ndarray:
    """A scikit-image sample as HxWx3 uint8 BGR."""
    rgb = np.asarray(getattr(require("skimage.data"), name)(), np.uint8)
    if rgb.ndim == 2:
        rgb = np.stack([rgb] * 3, axis=-1)
    return np.ascontiguousarray(rgb[:, :, ::-1])


def _variants(image: np.ndarray, count: int, rng: np.random.Generator, max_side: int) -> List[np.ndarray]:
    """Deterministic random crops (35-100 % of the area, aspect 3:4-4:3), flips, scales (longest side 160-max_side)."""
    cv2 = require("cv2")
    h, w = image.shape[:2]
    out = []
    for _ in range(count):
        area = rng.uniform(0.35, 1.0) * h * w
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw = int(min(w, round(np.sqrt(area * aspect))))
        ch = int(min(h, round(np.sqrt(area / aspect))))
        x0 = int(rng.integers(0, w - cw + 1))
        y0 = int(rng.integers(0, h - ch + 1))
        crop = image[y0:y0 + ch, x0:x0 + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        side = int(rng.integers(160, max_side + 1))
        scale = side / max(ch, cw)
        size = (max(MIN_SIDE, int(round(cw * scale))), max(MIN_SIDE, int(round(ch * scale))))
        out.append(cv2.resize(np.ascontiguousarray(crop), size, interpolation=cv2.INTER_AREA))
    return out


def make_default_sets(root: str = "calibration", seed: int = 0,
                      log: Callable[..., None] = print) -> Tuple[CalibrationSet, CalibrationSet]:
    """Regenerate `root/default` (8 photos x 8 variants, <= 320 px) and the held-out `root/regression`.

    The regression set (100 images, <= 256 px) holds other crops (another random stream) of the same
    photos, 8 each, plus 9 each of four photographs that calibration never sees. Deterministic for a
    given seed and OpenCV/libjpeg build.
    """
    cv2 = require("cv2")
    sets = []
    plans = (
        ("default", [(p, 8) for p in CALIBRATION_PHOTOS], seed, 320),
        ("regression", [(p, 8) for p in CALIBRATION_PHOTOS] + [(p, 9) for p in HELD_OUT_PHOTOS], seed + 1000, 256),
    )
    for folder, photos, stream, max_side in plans:
        rng = np.random.default_rng(stream)
        out_dir = os.path.join(root, folder)
        with atomic_dir(out_dir, MANIFEST, "set") as tmp:
            kept = SetWriter(tmp)
            for photo, count in photos:
                for i, image in enumerate(_variants(_skimage_photo(photo), count, rng, max_side)):
                    name = "{}-{:02d}.jpg".format(photo, i)
                    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 88])
                    if not ok:
                        raise EdgeError("could not encode " + name)
                    kept.add(name, encoded.tobytes(), (image.shape[1], image.shape[0]))
            # A fixed "created" keeps regenerated manifests byte-identical.
            manifest = kept.finish("scikit-image sample photographs (see README.md)",
                                   {"generator": "scripts/make_default_calibration.py", "seed": stream,
                                    "created": "generated"})
        total = sum(os.path.getsize(os.path.join(out_dir, n)) for n in kept.hashes)
        log("calibration: wrote {} ({} images, {:.2f} MB, set sha256 {})".format(
            out_dir, len(kept.hashes), total / 1e6, manifest["sha256"][:12]))
        sets.append(CalibrationSet(out_dir, sorted(kept.hashes), manifest["sha256"], manifest))
    return sets[0], sets[1]
