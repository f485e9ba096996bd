"""Calibration and regression image sets: a folder of images plus `manifest.json`.

    calibration/default/
        manifest.json        {"files": [{"name", "sha256", "width", "height"}], "sha256": <set hash>,
                              "source": ..., "created": ..., "count": N, "skipped": {...}}
        astronaut-00.jpg ...

The set hash is the sha256 of `sha256sum`-style lines ("<file sha256>  <name>\\n", sorted by name), so
it names exactly the bytes a calibration saw; artifact manifests record it. Images in a subfolder
(`regression/7/x.png`) carry that folder's name as their label (edge.model.gate). Every write goes to a
temporary folder beside the target and is renamed into place: a set is never half-written, and only a folder
whose manifest lists every file in it is ever replaced (anything else may hold the user's files).
"""

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from edge.errors import EdgeError, require
from edge.inputs import load_json, read_image
from edge.model.capture_options import DEFAULT_MIN_DIFF
from edge.model.class_labels import index_of_name, is_index, label_lines
from edge.store.artifact import sha256_bytes, sha256_file
from edge.store.fileio import atomic_dir, write_json_atomic

MANIFEST = "manifest.json"
MIN_SIDE = 32  # smaller images cannot be resized/cropped meaningfully
TRT_RECOMMENDED_IMAGES = 500  # "TensorRT recommends ... at least 500" (ModelOpt README)
THUMB = 16  # near-duplicate test: mean |difference| of 16x16 grey thumbnails
_DECODABLE = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pnm", ".jp2")


@dataclass
class CalibrationSet:
    """A loaded, verified set. `files` are paths relative to `root`, sorted."""

    root: str
    files: List[str]
    sha256: str
    manifest: Dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.files)

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def read(self, name: str) -> np.ndarray:
        """One image as HxWx3 uint8 BGR."""
        cv2 = require("cv2")
        image = cv2.imread(self.path(name), cv2.IMREAD_COLOR)
        if image is None:
            raise EdgeError("{}: unreadable image in calibration set".format(self.path(name)))
        return image

    def images(self) -> Iterator[np.ndarray]:
        for name in self.files:
            yield self.read(name)

    def label_of(self, name: str) -> Optional[str]:
        """The subfolder an image sits in (its label), or None for images at the top level."""
        parts = name.split("/")
        return parts[0] if len(parts) > 1 else None


def set_hash(file_hashes: Dict[str, str]) -> str:
    lines = "".join("{}  {}\n".format(file_hashes[name], name) for name in sorted(file_hashes))
    return sha256_bytes(lines.encode("utf-8"))


def load_calibration_set(path: str, min_images: int = 1, verify: bool = True, what: str = "calibration set",
                         hint: str = "") -> CalibrationSet:
    """Read `path/manifest.json`; with `verify`, re-hash every file against it. `hint`: how to make a missing one."""
    hint = hint or "create it with: edge calibrate import IMAGES_DIR {} (or edge calibrate capture)".format(path)
    if not os.path.isdir(path):
        raise EdgeError("{}: {} not found ({})".format(path, what, hint))
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise EdgeError("{}: no {}, so not a {} ({})".format(path, MANIFEST, what, hint))
    manifest = load_json(manifest_path, "manifest")
    try:
        entries = {str(e["name"]): str(e["sha256"]) for e in manifest["files"]}
        recorded = str(manifest["sha256"])
    except (KeyError, TypeError) as exc:
        raise EdgeError("{}: unreadable manifest ({}: {})".format(manifest_path, type(exc).__name__, exc)) from None
    if verify:
        actual = {}
        for name in entries:
            try:
                actual[name] = sha256_file(os.path.join(path, name))
            except OSError:
                raise EdgeError("{}: listed in {} but missing ({})".format(
                    os.path.join(path, name), MANIFEST, hint)) from None
        changed = sorted(n for n in entries if actual[n] != entries[n])
        if changed or set_hash(actual) != recorded:
            raise EdgeError("{}: {} changed since {} was written ({}{}); re-import the set".format(
                path, ", ".join(changed[:3]) or "set hash", MANIFEST, len(changed), " files" if changed else ""))
    if len(entries) < min_images:
        raise EdgeError("{}: {} has {} images, at least {} needed (build.min_images)".format(
            path, what, len(entries), min_images))
    return CalibrationSet(root=path, files=sorted(entries), sha256=recorded, manifest=manifest)


class SetWriter:
    """The one writer of a set's files, into the temporary folder `atomic_dir` yields: each image with its sha256
    and size, then the manifest that lists them (`finish`)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.hashes: Dict[str, str] = {}
        self.sizes: Dict[str, Tuple[int, int]] = {}

    def add(self, name: str, data: bytes, size: Tuple[int, int]) -> None:
        """One image (`size`: width, height), readable by every user (the service user reads what root captured)."""
        path = os.path.join(self.folder, name)
        if not os.path.isdir(os.path.dirname(path)):  # a label subfolder
            os.makedirs(os.path.dirname(path))
            os.chmod(os.path.dirname(path), 0o755)
        with open(path, "wb") as fh:
            fh.write(data)
        os.chmod(path, 0o644)
        self.hashes[name], self.sizes[name] = sha256_bytes(data), size

    def finish(self, source: str, extra: Dict[str, Any]) -> Dict[str, Any]:
        hashes, sizes = self.hashes, self.sizes
        manifest = {
            "version": 1,
            "source": source,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "count": len(hashes),
            "sha256": set_hash(hashes),
            "files": [{"name": n, "sha256": hashes[n], "width": sizes[n][0], "height": sizes[n][1]}
                      for n in sorted(hashes)],
        }
        manifest.update(extra)
        write_json_atomic(os.path.join(self.folder, MANIFEST), manifest, "manifest")
        return manifest


def warn_if_few(count: int, log: Callable[..., None]) -> None:
    """TensorRT's recommendation, said once wherever a set under 500 images is made or used."""
    if count < TRT_RECOMMENDED_IMAGES:
        log("calibration: {} images; TensorRT recommends at least {} for INT8 calibration".format(
            count, TRT_RECOMMENDED_IMAGES))


def thumbnail(image: np.ndarray) -> np.ndarray:
    """The near-duplicate test's 16x16 grey thumbnail of a BGR image (capture's, and the gate's set overlap)."""
    cv2 = require("cv2")
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    return cv2.resize(grey, (THUMB, THUMB), interpolation=cv2.INTER_AREA).astype(np.float32).ravel()


def nearest_difference(thumbs: np.ndarray, thumb: np.ndarray) -> float:
    """The mean grey-level difference of `thumb` to the closest of `thumbs` (N x THUMB^2; inf when N is 0): below
    the capture's min_diff, a near-duplicate."""
    return float(np.abs(thumbs - thumb).mean(axis=1).min()) if len(thumbs) else float("inf")


def frames_of(capture: Any, limit: int) -> Iterator[Any]:
    """Up to `limit` frames (0: all) of an unopened capture (edge.sources.source); it is closed at the end."""
    capture.open()
    try:
        count = 0
        while limit <= 0 or count < limit:
            image = capture.read()
            if image is None:
                return
            count += 1
            yield image
    finally:
        capture.close()


def capture_calibration_set(frames: Iterable[Any], out_dir: str, every_k: int = 30, max_images: int = 500,
                            min_images: int = 1, min_diff: float = DEFAULT_MIN_DIFF, source: str = "capture",
                            quality: int = 95, log: Callable[..., None] = print) -> CalibrationSet:
    """Keep every `every_k`-th frame (BGR arrays, or objects with `.image`) unless it nearly duplicates a kept one.

    Stops after `max_images` kept frames or when `frames` ends. Fewer than `min_images`: EdgeError, nothing written.
    """
    cv2 = require("cv2")
    if every_k < 1 or max_images < 1:
        raise EdgeError("capture: every_k and max_images must be >= 1, got {} and {}".format(every_k, max_images))
    thumbs: List[np.ndarray] = []
    seen = duplicates = small = 0
    with atomic_dir(out_dir, MANIFEST, "set") as tmp:
        kept = SetWriter(tmp)
        for index, frame in enumerate(frames):
            seen += 1
            if index % every_k:
                continue
            image = getattr(frame, "image", frame)
            if not (isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[2] == 3
                    and image.dtype == np.uint8):
                raise EdgeError("capture: frame {} is not an HxWx3 uint8 BGR image".format(index))
            if min(image.shape[:2]) < MIN_SIDE:
                small += 1
                continue
            thumb = thumbnail(image)
            if thumbs and nearest_difference(np.stack(thumbs), thumb) < min_diff:
                duplicates += 1
                continue
            ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if not ok:
                raise EdgeError("capture: could not encode frame {} as JPEG".format(index))
            kept.add("{:05d}.jpg".format(len(kept.hashes)), encoded.tobytes(), (image.shape[1], image.shape[0]))
            thumbs.append(thumb)
            if len(kept.hashes) >= max_images:
                break
        if len(kept.hashes) < min_images:
            raise EdgeError("capture: kept {} images from {} frames ({} near-duplicates), at least {} needed; "
                            "capture longer or lower --every".format(len(kept.hashes), seen, duplicates, min_images))
        manifest = kept.finish(source, {
            "capture": {"every_k": every_k, "frames_seen": seen, "near_duplicates": duplicates,
                        "too_small": small, "min_diff": min_diff}})
    log("calibration: captured {} images from {} frames into {} ({} near-duplicates skipped)".format(
        len(kept.hashes), seen, out_dir, duplicates))
    warn_if_few(len(kept.hashes), log)
    return CalibrationSet(out_dir, sorted(kept.hashes), manifest["sha256"], manifest)


def _to_bgr8(image: np.ndarray) -> np.ndarray:
    """Any decoded image (grey or BGR; 8 or 16 bit) -> HxWx3 uint8 BGR."""
    cv2 = require("cv2")
    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    elif image.dtype != np.uint8:
        raise ValueError("unsupported pixel type " + str(image.dtype))
    if image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1):
        return cv2.cvtColor(image.reshape(image.shape[:2]), cv2.COLOR_GRAY2BGR)
    if image.ndim == 3 and image.shape[2] == 3:
        return image
    raise ValueError("unsupported shape " + str(image.shape))


def _summary(skipped: Dict[str, List[str]], total: int) -> str:
    parts = []
    for reason in sorted(skipped):
        names = skipped[reason]
        more = " +{} more".format(len(names) - 3) if len(names) > 3 else ""
        parts.append("{} {} ({}{})".format(len(names), reason, ", ".join(names[:3]), more))
    return "import: skipped {} of {} files: {}".format(sum(len(v) for v in skipped.values()), total, "; ".join(parts))


def _has_alpha(data: bytes) -> bool:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return data[25:26] in (b"\x04", b"\x06")  # IHDR colour type: grey + alpha, RGBA
    if data[:2] == b"\xff\xd8":
        return False  # JPEG has no alpha
    cv2 = require("cv2")
    raw = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    return raw is not None and raw.ndim == 3 and raw.shape[2] == 4


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes, kept by os.walk as surrogates
        return False
    return True


def _decode_candidate(path: str, rel: str) -> Tuple[bytes, Optional[np.ndarray], Optional[str]]:
    """(bytes, decoded image, None) or (bytes, None, why it is skipped): edge.inputs.read_image's limits, then
    images too small to crop are skipped too. Decoded as a set is read (EXIF orientation applied, alpha dropped),
    keeping grey and 16 bits to convert."""
    cv2 = require("cv2")
    data, image, why = read_image(path, cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR)
    if image is None:
        if why == "not a readable image":
            why = "unreadable" if rel.lower().endswith(_DECODABLE) else "not an image"
        return data, None, why
    if min(image.shape[:2]) < MIN_SIDE:
        return data, None, "smaller than {} px".format(MIN_SIDE)
    return data, image, None


WORDNET_ID = re.compile(r"^n[0-9]{8}$")


def class_index_of(labels: Optional[List[str]], wordnet: Callable[[], Dict[str, int]],
                   where: str) -> Callable[[str], str]:
    """ImageFolder labels: a class-per-folder name -> the class index the set stores (`<index>/<image>`, what the
    gate reads without a labels file). A folder is a class index, a line of `labels` (the model's labels file) or
    an ImageNet WordNet id (n01440764: ImageNet-1k's index, from `wordnet()`); anything else is an EdgeError naming
    the folder under `where`. Without `labels`, other names are kept as they are (the gate reads them as labels;
    the import says so)."""
    lines = label_lines(labels)

    def resolve(folder: str) -> str:
        if is_index(folder) and (labels is None or int(folder) < len(labels)):
            return str(int(folder))
        line = index_of_name(folder, lines, where)
        if line is not None:
            return str(line)
        if WORDNET_ID.match(folder):
            table = wordnet()
            if folder in table and (labels is None or table[folder] < len(labels)):
                return str(table[folder])
        if labels is None and not WORDNET_ID.match(folder):
            return folder
        raise EdgeError("{}/{}: a label folder must be a class index, a line of the labels file or an ImageNet "
                        "WordNet id (e.g. n01440764){}".format(where, folder, "" if labels is not None else
                                                               "; pass the model's labels with --labels"))

    return resolve


def _relabelled(rel: str, relabel: Optional[Callable[[str], str]]) -> str:
    parts = rel.split("/")
    if relabel is None or len(parts) < 2:
        return rel
    return "/".join([relabel(parts[0])] + parts[1:])


def import_calibration_set(src_dir: str, out_dir: str, min_images: int = 32, source: Optional[str] = None,
                           log: Callable[..., None] = print, relabel: Optional[Callable[[str], str]] = None,
                           regression: bool = False) -> CalibrationSet:
    """Copy the usable images under `src_dir` (subfolders kept: they are labels, renamed by `relabel`, e.g.
    class_index_of) into a new set at `out_dir` (`regression`: build.regression_dir's, advised as such: _advise).
    3-channel 8-bit images are copied byte for byte; grey, 4-channel and 16-bit ones are converted to BGR PNG.
    Sizes are recorded as the set is read (EXIF orientation applied); names that are not UTF-8 are skipped. Zero-byte,
    unreadable, non-image and too-small (< MIN_SIDE px) files are skipped and listed in one line."""
    cv2 = require("cv2")
    if not os.path.isdir(src_dir):
        raise EdgeError("{}: source folder not found".format(src_dir))
    candidates = []
    for root, dirs, files in os.walk(src_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and name != MANIFEST:
                candidates.append(os.path.relpath(os.path.join(root, name), src_dir).replace(os.sep, "/"))
    skipped: Dict[str, List[str]] = {}
    total = len(candidates)
    for rel in [c for c in candidates if not _utf8(c)]:  # a set's names go into JSON and its set hash as UTF-8
        candidates.remove(rel)
        skipped.setdefault("file name not UTF-8", []).append(os.fsencode(rel).decode("utf-8", "backslashreplace"))
    with atomic_dir(out_dir, MANIFEST, "set", keep_out=src_dir) as tmp:
        kept = SetWriter(tmp)
        for rel in candidates:
            data, image, reason = _decode_candidate(os.path.join(src_dir, rel), rel)
            if image is None or reason is not None:
                skipped.setdefault(reason or "unreadable", []).append(rel)
                continue
            try:
                bgr = _to_bgr8(image)
            except ValueError:
                skipped.setdefault("unsupported pixel format", []).append(rel)
                continue
            if bgr is not image or _has_alpha(data):  # converted (alpha dropped as every reader drops it): PNG
                rel = os.path.splitext(rel)[0] + ".png"
                ok, encoded = cv2.imencode(".png", bgr)
                if not ok:
                    raise EdgeError("{}: could not encode as PNG".format(rel))
                data = encoded.tobytes()
            base, ext = os.path.splitext(_relabelled(rel, relabel))
            n, rel = 1, base + ext
            while rel in kept.hashes:
                rel = "{}-{}{}".format(base, n, ext)
                n += 1
            kept.add(rel, data, (bgr.shape[1], bgr.shape[0]))
        if skipped:
            log(_summary(skipped, total))
        if len(kept.hashes) < min_images:
            raise EdgeError("{}: {} usable images, at least {} needed (build.min_images / --min-images)".format(
                src_dir, len(kept.hashes), min_images))
        manifest = kept.finish(source or os.path.abspath(src_dir),
                               {"skipped": {k: sorted(v) for k, v in skipped.items()}})
    log("calibration: imported {} images into {} (set sha256 {})".format(len(kept.hashes), out_dir,
                                                                         manifest["sha256"][:12]))
    _advise(list(kept.hashes), regression, log)
    return CalibrationSet(out_dir, sorted(kept.hashes), manifest["sha256"], manifest)


def _advise(files: List[str], regression: bool, log: Callable[..., None]) -> None:
    """After an import: folders kept by name (the build matches them against the model's labels), and the size
    advice of what the set is: a regression set (every image in a class folder, or build.regression_dir) gets the
    gate's, a calibration set TensorRT's."""
    folders, images = sorted({name.split("/")[0] for name in files if "/" in name}), len(files)
    regression = regression or all("/" in name for name in files)
    names = [f for f in folders if not f.isdigit()]
    if names:
        log("import: {} class folders kept by name ({}{}): the build reads them as lines of the model's labels "
            "file; pass --labels to check them now".format(len(names), ", ".join(names[:3]),
                                                           ", ..." if len(names) > 3 else ""))
    if regression:
        log("regression: {} images in {} classes; the gate's top-1 claim of +-1 pp needs ~2,400-4,700 labelled "
            "images (docs/build.md)".format(images, len(folders)))
    else:
        warn_if_few(images, log)
