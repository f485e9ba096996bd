"""Preprocessing: BGR frame -> 1x3xCxC float32 tensor, faithful to torchvision's eval transform.

The algorithm, defined once (the CUDA kernel in edge/cuda/preprocess.cuh computes the same sums):

1. Geometry of torchvision's Resize(resize) + CenterCrop(crop): the shorter side becomes `resize`,
   the longer `int(resize * long / short)`; the crop starts at `round((resized - crop) / 2)`.
2. Each output pixel is the antialiased bilinear (triangle) resampling that PIL's BILINEAR filter and
   torchvision's `antialias=True` use: for an output index `o` along an axis with scale
   `s = in_size / resized_size`, centre `c = (offset + o + 0.5) * s`, support `r = max(s, 1)`,
   taps `x` in `[max(int(c - r + 0.5), 0), min(int(c + r + 0.5), in_size))`, weights
   `max(0, 1 - |x - c + 0.5| / r)` normalised to sum 1. Only the pixels the crop keeps are computed.
3. Channels are reordered BGR -> RGB and `value * mul + add` applied with `mul = 1 / (255 std)` and
   `add = -mean / std`, written planar (CHW) into a preallocated buffer.

Unlike PIL, nothing is rounded to uint8 between passes, so the result is the exact filter (CpuPreprocessor, the
reference the CUDA kernel, calibration and the accuracy gate use).

FastPreprocessor (`preprocess.cpu: fast`, the service's CPU path) gets within a mean absolute difference of about
0.014 of it in a fraction of the time, by OpenCV: the crop's source region box-averaged by a whole factor k
(INTER_AREA, exact and fast for whole factors) so that what is left is a reduction by about 1.4, then bilinear
sampling at the exact positions step 2 gives (remap, with tables made once per frame size). For frames too small
for that (a reduction under FAST_MIN_SCALE), it runs the exact filter.

The constants (resize, crop, mean, std) travel with the model: `model_preprocess` takes them from its model info.
"""

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from edge.config import PreprocessConfig, check_preprocess
from edge.errors import EdgeError, require
from edge.fields import build
from edge.store.artifact import info_path

# Frame sizes whose plans (weights and scratch buffers, up to ~100 MB for a 12 MP photo) are kept: a camera
# has one size, a folder of photographs many.
MAX_PLANS = 2
_ROW_BLOCK = 4  # output rows (and columns) per matrix product: measured fastest (skips most zero taps)


@dataclass(frozen=True)
class Geometry:
    """Where the crop sits in the (virtual) resized image, and the source/resized scale per axis."""

    src_w: int
    src_h: int
    scale_x: float
    scale_y: float
    offset_x: int
    offset_y: int
    crop: int


MODEL_KEYS = ("resize", "crop", "mean", "std")
FAST_STEP = 1.4  # the fast path's bilinear step after the box average (measured: larger steps alias)
FAST_MIN_SCALE = 2.2  # smaller reductions (640x480 and below) run the exact filter
_TOLERANCE = 1e-6  # relative: a YAML file may spell 127/255 as 0.498039


def _same(a: Any, b: Any) -> bool:
    a, b = np.atleast_1d(np.asarray(a, np.float64)), np.atleast_1d(np.asarray(b, np.float64))
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=_TOLERANCE, atol=0.0))


def model_preprocess(cfg: PreprocessConfig, info: Dict[str, Any], model_path: str, where: str) -> PreprocessConfig:
    """The preprocessing a model is fed: the config's, with the model info's `preprocess` constants filling in.

    A key the config leaves at its default takes the model's value; a config value equal to the model's is fine;
    a different one is refused in one line (the model was trained with its own constants). A model info without
    `preprocess` (older exports, your own models) leaves the config as it is."""
    declared = info.get("preprocess")
    if declared is None:
        return cfg
    info_file = info_path(model_path)
    if not isinstance(declared, dict) or any(key not in declared for key in MODEL_KEYS):
        raise EdgeError("{}: 'preprocess' must give {}".format(info_file, ", ".join(MODEL_KEYS)))
    # the config's declared types and ranges (edge/config.py), naming the model info and its key
    model = build(PreprocessConfig, {k: declared[k] for k in MODEL_KEYS}, info_file, "preprocess")
    check_preprocess(model, info_file)
    default, chosen = PreprocessConfig(), {}
    for key in MODEL_KEYS:
        mine, theirs = getattr(cfg, key), getattr(model, key)
        if not (_same(mine, getattr(default, key)) or _same(mine, theirs)):
            raise EdgeError("{}: 'preprocess.{}' is {}, but {} was trained with {} ({}); remove the key or set "
                            "it to the model's value".format(where, key, mine, model_path, theirs, info_file))
        chosen[key] = theirs
    return dataclasses.replace(cfg, **chosen)


def crop_geometry(src_w: int, src_h: int, *, resize: int, crop: int) -> Geometry:
    if src_w <= src_h:
        new_w, new_h = resize, int(resize * src_h / src_w)
    else:
        new_w, new_h = int(resize * src_w / src_h), resize
    return Geometry(
        src_w=src_w, src_h=src_h,
        scale_x=src_w / new_w, scale_y=src_h / new_h,
        offset_x=int(round((new_w - crop) / 2.0)), offset_y=int(round((new_h - crop) / 2.0)),
        crop=crop,
    )


def axis_weights(n_out: int, *, offset: int, scale: float, in_size: int) -> Tuple[np.ndarray, int]:
    """Dense (n_out, span) float32 resampling matrix over source indices [first, first + span)."""
    support = max(scale, 1.0)
    taps: List[Tuple[int, np.ndarray]] = []
    for o in range(n_out):
        centre = (offset + o + 0.5) * scale
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), in_size)
        w = np.maximum(0.0, 1.0 - np.abs((np.arange(lo, hi) - centre + 0.5) / support))
        taps.append((lo, w / w.sum()))
    first = taps[0][0]
    span = max(lo + len(w) for lo, w in taps) - first
    matrix = np.zeros((n_out, span), np.float32)
    for o, (lo, w) in enumerate(taps):
        matrix[o, lo - first:lo - first + len(w)] = w
    return matrix, first


def _blocks(matrix: np.ndarray) -> List[Tuple[int, int, int, np.ndarray]]:
    """Split a banded matrix into row blocks with only the columns they touch: (row0, col_lo, col_hi, block)."""
    out = []
    for r0 in range(0, matrix.shape[0], _ROW_BLOCK):
        rows = matrix[r0:r0 + _ROW_BLOCK]
        nonzero = np.flatnonzero(rows.any(axis=0))
        lo, hi = int(nonzero[0]), int(nonzero[-1]) + 1
        out.append((r0, lo, hi, np.ascontiguousarray(rows[:, lo:hi])))
    return out


class _Plan:
    """Everything that depends only on the frame size, computed once per size."""

    def __init__(self, geometry: Geometry):
        g = geometry
        wy, self.y0 = axis_weights(g.crop, offset=g.offset_y, scale=g.scale_y, in_size=g.src_h)
        wx, self.x0 = axis_weights(g.crop, offset=g.offset_x, scale=g.scale_x, in_size=g.src_w)
        self.y1, self.x1 = self.y0 + wy.shape[1], self.x0 + wx.shape[1]
        self.rows = _blocks(wy)
        # Horizontal pass on interleaved BGR rows: column weights expanded to act on x*3+c.
        self.cols = [(c0, lo, hi, np.kron(block.T, np.eye(3, dtype=np.float32))) for c0, lo, hi, block in _blocks(wx)]
        span_x = self.x1 - self.x0
        self.region = np.empty((self.y1 - self.y0, span_x * 3), np.float32)
        self.vertical = np.empty((g.crop, span_x * 3), np.float32)
        self.horizontal = np.empty((g.crop, g.crop * 3), np.float32)


def _plan_for(plans: "OrderedDict[Tuple[int, int], Any]", frame: np.ndarray, make: Callable[[], Any]) -> Any:
    """The plan for `frame`'s size (made by `make()` at its first frame), most recently used last: at most MAX_PLANS
    sizes are kept (a folder of photos of many sizes: memory stays bounded). A frame that is not HxWx3 uint8 BGR is
    a ValueError."""
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise ValueError("expected an HxWx3 uint8 BGR frame, got {} {}".format(frame.shape, frame.dtype))
    key = (frame.shape[0], frame.shape[1])
    plan = plans.get(key)
    if plan is None:
        while len(plans) >= MAX_PLANS:
            plans.popitem(last=False)
        plan = plans[key] = make()
    else:
        plans.move_to_end(key)
    return plan


class Preprocessor:
    """The preprocessing stage (CPU here, CUDA in edge.infer.cuda_preprocess): an HxWx3 uint8 BGR frame -> the
    backend's (1, 3, crop, crop) input, RGB and normalised, in one buffer reused by every call."""

    name = "base"  # the device it runs on, as reports say it

    def __call__(self, frame: np.ndarray) -> Any:
        raise NotImplementedError

    def write_as(self, dtype: Any) -> None:
        """Write the backend's input dtype from now on; a host array stays float32 (the backend casts it)."""

    def close(self) -> None:
        """Free what it holds; safe to call twice."""


class CpuPreprocessor(Preprocessor):
    """NumPy implementation. `__call__` returns the same preallocated (1, 3, crop, crop) buffer each time."""

    name = "cpu"

    def __init__(self, cfg: PreprocessConfig):
        self.cfg = cfg
        std = np.asarray(cfg.std, np.float32)
        mean = np.asarray(cfg.mean, np.float32)
        self.mul = (1.0 / (255.0 * std)).astype(np.float32)
        self.add = (-mean / std).astype(np.float32)
        self.output = np.empty((1, 3, cfg.crop, cfg.crop), np.float32)
        self._plans: "OrderedDict[Tuple[int, int], _Plan]" = OrderedDict()  # most recently used last

    def geometry(self, frame_shape: Tuple[int, ...]) -> Geometry:
        return crop_geometry(frame_shape[1], frame_shape[0], resize=self.cfg.resize, crop=self.cfg.crop)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        p = _plan_for(self._plans, frame, lambda: _Plan(self.geometry(frame.shape)))
        region = frame[p.y0:p.y1, p.x0:p.x1].reshape(p.y1 - p.y0, -1)
        np.copyto(p.region, region, casting="unsafe")
        for r0, lo, hi, block in p.rows:
            np.matmul(block, p.region[lo:hi], out=p.vertical[r0:r0 + block.shape[0]])
        for c0, lo, hi, block in p.cols:
            np.matmul(p.vertical[:, lo * 3:hi * 3], block, out=p.horizontal[:, c0 * 3:c0 * 3 + block.shape[1]])
        hwc = p.horizontal.reshape(self.cfg.crop, self.cfg.crop, 3)
        out = self.output[0]
        for c in range(3):  # RGB output channel c comes from BGR channel 2 - c
            np.multiply(hwc[:, :, 2 - c], self.mul[c], out=out[c])
            out[c] += self.add[c]
        return self.output


class FastPreprocessor(Preprocessor):
    """OpenCV's box average by a whole factor, then bilinear sampling at the exact positions (module docstring).
    Same call shape as CpuPreprocessor, whose exact filter it runs for frames it has no fast plan for."""

    name = "cpu"  # the device, as the exact one: `preprocess.cpu` says which filter

    def __init__(self, cfg: PreprocessConfig):
        self.exact = CpuPreprocessor(cfg)
        self.cfg, self.output = cfg, self.exact.output
        self._plans: "OrderedDict[Tuple[int, int], Any]" = OrderedDict()
        self._cv2 = require("cv2")
        # value * mul + add for each uint8 value of each RGB channel, in float32 as the exact path computes it: one
        # table look-up per pixel instead of a multiply and an add (fewer calls: the frame path runs with cold caches)
        values = np.arange(256, dtype=np.uint8)
        self._tables = [(np.multiply(values, self.exact.mul[c], casting="unsafe", dtype=np.float32)
                         + self.exact.add[c]).reshape(256, 1) for c in range(3)]

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        plan = _plan_for(self._plans, frame, lambda: _fast_plan(self.exact.geometry(frame.shape), self._cv2))
        if plan is None:
            return self.exact(frame)
        cv2, (k, y0, y1, x0, x1, xy, weights) = self._cv2, plan
        small = cv2.resize(frame[y0:y1, x0:x1], ((x1 - x0) // k, (y1 - y0) // k), interpolation=cv2.INTER_AREA)
        hwc = cv2.remap(small, xy, weights, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        blue, green, red = cv2.split(hwc)
        for plane, table, out in zip((red, green, blue), self._tables, self.output[0]):
            cv2.LUT(plane, table, dst=out)  # written in place: `out` is a contiguous float32 plane
        return self.output


def _fast_plan(g: Geometry, cv2: Any) -> Any:
    """(k, source region y0, y1, x0, x1, then OpenCV's fixed-point remap tables: where each output pixel samples the
    box-averaged image), or None for the exact filter. Region edges are multiples of k, so box pixel j covers source
    [x0 + k j, x0 + k j + k)."""
    scale = min(g.scale_x, g.scale_y)
    k = max(1, int(round(scale / FAST_STEP)))
    if scale < FAST_MIN_SCALE or k < 1:
        return None
    bounds = []
    for offset, s, size in ((g.offset_y, g.scale_y, g.src_h), (g.offset_x, g.scale_x, g.src_w)):
        lo = max(0, int(offset * s) - 2 * k) // k * k
        hi = min(size, int(np.ceil((offset + g.crop) * s)) + 2 * k) // k * k
        bounds.append((lo, hi))
    (y0, y1), (x0, x1) = bounds
    # output o's centre, (offset + o + 0.5) * s in source units, in box-pixel coordinates (centres at integers)
    o = np.arange(g.crop, dtype=np.float64)
    xs, ys = np.meshgrid(((g.offset_x + 0.5 + o) * g.scale_x - x0) / k - 0.5,
                         ((g.offset_y + 0.5 + o) * g.scale_y - y0) / k - 0.5)
    xy, weights = cv2.convertMaps(xs.astype(np.float32), ys.astype(np.float32), cv2.CV_16SC2)
    return k, y0, y1, x0, x1, xy, weights


def cpu_preprocessor(cfg: PreprocessConfig) -> Preprocessor:
    """The CPU preprocessor `preprocess.cpu` chooses: fast (the service's default) or exact."""
    return FastPreprocessor(cfg) if cfg.cpu == "fast" else CpuPreprocessor(cfg)
