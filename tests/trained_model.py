"""A MobileNetV3-Small that has learned something, for the INT8 accuracy tests and benchmarks/int8_accuracy.py.

torchvision's mobilenet_v3_small(num_classes=10, width_mult=0.5) trained on scikit-learn's `load_digits` upscaled to
64x64 (stratified 1200 train / 300 calibration pool / 297 held-out test, fixed seeds): 6 epochs reach 97.6 % in
~22 s on one idle core (the full-width network: 98.0 % in ~64 s, and every test using it 3-4x slower), exported by
edge.model.export.export_onnx. Its inputs come from the runtime's CpuPreprocessor with resize 64 / crop 64 (an
identity resample of a 64x64 image), exactly as training normalised them.

tests/conftest.py's session fixtures `digits` and `digits_qdq` give it and its Q/DQ model, made once per test run
and shared by the pytest-xdist workers (tests/shared_models.py).
"""

import json
import os
import time
from dataclasses import dataclass
from typing import Callable, List, Tuple

import numpy as np

from edge.config import PreprocessConfig
from edge.model.calibration import import_calibration_set

SIZE = 64
EPOCHS = 6
WIDTH = 0.5
SEED = 0
CALIBRATION_IMAGES = 64
TRAINED = "trained.json"  # written last: its presence means the folder is complete
HELD_OUT = "held-out.npz"  # the test images and labels: a worker reads them without importing scikit-learn


@dataclass
class DigitsModel:
    root: str
    onnx: str  # FP32 export, with <stem>.labels.txt ("0".."9") and <stem>.json (trained: true)
    preprocess: PreprocessConfig
    calibration: str  # 64 training-distribution images (a calibration set with manifest)
    regression: str  # 297 held-out test images in label subfolders 0..9
    grey_calibration: str  # 32 uniform grey images: a calibration that breaks INT8
    test_images: np.ndarray  # N x 64 x 64 x 3 uint8 BGR
    test_labels: np.ndarray
    torch_top1: float
    train_seconds: float


def digit_images() -> Tuple[np.ndarray, np.ndarray]:
    """load_digits (8x8, 0-16) -> 64x64 BGR uint8 (grey digits on black), labels."""
    import cv2
    from sklearn.datasets import load_digits

    digits = load_digits()
    out = np.empty((len(digits.images), SIZE, SIZE, 3), np.uint8)
    for i, img in enumerate(digits.images):
        big = cv2.resize((img * (255.0 / 16.0)).astype(np.float32), (SIZE, SIZE), interpolation=cv2.INTER_CUBIC)
        out[i] = np.clip(big, 0, 255).astype(np.uint8)[:, :, None]
    return out, digits.target.astype(np.int64)


def split(labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    train, rest = train_test_split(idx, train_size=1200, stratify=labels, random_state=SEED)
    pool, test = train_test_split(rest, train_size=300, stratify=labels[rest], random_state=SEED)
    return train, pool, test


def normalise(images: np.ndarray, pre: PreprocessConfig) -> np.ndarray:
    """What CpuPreprocessor computes for a 64x64 frame with resize = crop = 64: RGB, (x/255 - mean)/std, NCHW."""
    rgb = images[..., ::-1].astype(np.float32) / 255.0
    return ((rgb - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)).transpose(0, 3, 1, 2).copy()


def _write_folder(folder: str, images: np.ndarray, labels: List[str]) -> None:
    import cv2

    for i, (img, label) in enumerate(zip(images, labels)):
        sub = os.path.join(folder, label) if label else folder
        os.makedirs(sub, exist_ok=True)
        cv2.imwrite(os.path.join(sub, "{:04d}.png".format(i)), img)


def _train(x, y, epochs: int):
    """AdamW + OneCycle with light shifts and noise; then BatchNorm statistics re-estimated."""
    import torch
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.mobilenet_v3_small(num_classes=10, width_mult=WIDTH)
    batch = 64
    steps = epochs * ((len(x) + batch - 1) // batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=4e-3, total_steps=steps)
    gen = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), batch):
            xb, yb = x[order[i:i + batch]], y[order[i:i + batch]]
            dx, dy = torch.randint(-4, 5, (2,), generator=gen).tolist()
            xb = torch.roll(xb, shifts=(dy, dx), dims=(2, 3)) + 0.05 * torch.randn(xb.shape, generator=gen)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    # torchvision's MobileNetV3 BatchNorm uses momentum 0.01: after ~150 steps its running statistics are
    # still mostly the initial ones. Re-estimate them as a plain average over the training set.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None
        for i in range(0, len(x), 256):
            model(x[i:i + 256])
    return model.eval()


def train_digits_model(root: str, epochs: int = EPOCHS, log: Callable[..., None] = lambda *a: None) -> DigitsModel:
    import torch

    from edge.model.export import export_onnx

    pre = PreprocessConfig(resize=SIZE, crop=SIZE)
    images, labels = digit_images()
    train, pool, test = split(labels)
    x = torch.from_numpy(normalise(images[train], pre))
    y = torch.from_numpy(labels[train])
    threads = torch.get_num_threads()
    # One thread: on this shared 2-core machine two OpenMP threads ran 0.6-7x slower (spinning on a
    # descheduled sibling).
    torch.set_num_threads(1)
    started = time.monotonic()
    try:
        model = _train(x, y, epochs)
        seconds = time.monotonic() - started
        with torch.no_grad():
            pred = model(torch.from_numpy(normalise(images[test], pre))).argmax(1).numpy()
    finally:
        torch.set_num_threads(threads)
    top1 = float(np.mean(pred == labels[test]))
    log("digits: trained {} epochs in {:.1f} s, torch top-1 {:.2%}".format(epochs, seconds, top1))

    onnx_path = os.path.join(root, "digits.onnx")
    export_onnx(model, onnx_path, [str(i) for i in range(10)], "digits(seed={},epochs={})".format(SEED, epochs),
                True, "mobilenet_v3_small", input_size=SIZE, log=log)
    raw = os.path.join(root, "raw")
    _write_folder(os.path.join(raw, "calibration"), images[pool[:CALIBRATION_IMAGES]], [""] * CALIBRATION_IMAGES)
    _write_folder(os.path.join(raw, "regression"), images[test], [str(v) for v in labels[test]])
    rng = np.random.default_rng(SEED)
    grey = np.stack([np.full((SIZE, SIZE, 3), level, np.uint8) for level in rng.integers(90, 170, 32)])
    _write_folder(os.path.join(raw, "grey"), grey, [""] * len(grey))
    quiet = lambda *a: None  # noqa: E731
    sets = {}
    for name in ("calibration", "regression", "grey"):
        sets[name] = os.path.join(root, name)
        import_calibration_set(os.path.join(raw, name), sets[name], min_images=1, log=quiet)
    np.savez(os.path.join(root, HELD_OUT), images=images[test], labels=labels[test])
    with open(os.path.join(root, TRAINED), "w", encoding="utf-8") as fh:
        json.dump({"torch_top1": top1, "train_seconds": seconds}, fh)
    return load_digits_model(root)


def load_digits_model(root: str) -> DigitsModel:
    """The model `train_digits_model(root)` left in `root` (another pytest-xdist worker may have trained it)."""
    with open(os.path.join(root, TRAINED), encoding="utf-8") as fh:
        trained = json.load(fh)
    with np.load(os.path.join(root, HELD_OUT)) as held_out:
        images, labels = held_out["images"], held_out["labels"]
    return DigitsModel(root=root, onnx=os.path.join(root, "digits.onnx"), preprocess=PreprocessConfig(resize=SIZE,
                       crop=SIZE), calibration=os.path.join(root, "calibration"),
                       regression=os.path.join(root, "regression"), grey_calibration=os.path.join(root, "grey"),
                       test_images=images, test_labels=labels, **trained)


def quantize_digits(digits: DigitsModel, out_path: str) -> None:
    """The digits model as a sound TensorRT-style Q/DQ model (minmax, sensitive nodes in float)."""
    from edge.model.calibration import load_calibration_set
    from edge.model.quantize import quantize_qdq

    quantize_qdq(digits.onnx, out_path, load_calibration_set(digits.calibration), digits.preprocess, "minmax", True,
                 show_progress=False, log=lambda *a: None)
