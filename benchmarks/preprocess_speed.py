"""CPU preprocessing of a 1280x720 frame to 224x224, side by side in one run: the exact filter (CpuPreprocessor),
the fast one the service uses (FastPreprocessor), OpenCV's INTER_AREA and PIL (torchvision's Resize + CenterCrop +
ToTensor + Normalize, what a user writes first). Rounds interleave the methods (these machines are noisy); each
prints its p50 / p99 per frame and its mean absolute difference from the exact filter on the four photographs.

    .venv/bin/python benchmarks/preprocess_speed.py [--rounds 10] [--frames 200] [--threads 1]

The issue's target: fast p50 <= 0.5 ms and mean |fast - exact| <= 0.02. --threads sets OpenCV's threads (the
service runs beside ONNX Runtime, which takes the cores: 1 is the honest setting).
"""

import argparse
import time

import cv2
import numpy as np

from edge.config import PreprocessConfig
from edge.infer.preprocess import CpuPreprocessor, FastPreprocessor

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def photos():
    import skimage.data

    return [cv2.resize(np.ascontiguousarray(getattr(skimage.data, name)()[:, :, ::-1]), (1280, 720),
                       interpolation=cv2.INTER_CUBIC) for name in PHOTOS]


def methods(cfg):
    import torchvision.transforms as T
    from PIL import Image

    exact, fast = CpuPreprocessor(cfg), FastPreprocessor(cfg)
    mul = (1.0 / (255.0 * np.asarray(cfg.std, np.float32))).astype(np.float32)
    add = (-np.asarray(cfg.mean, np.float32) / np.asarray(cfg.std, np.float32)).astype(np.float32)
    g = exact.geometry((720, 1280))
    y0, y1 = int(round(g.offset_y * g.scale_y)), int(round((g.offset_y + g.crop) * g.scale_y))
    x0, x1 = int(round(g.offset_x * g.scale_x)), int(round((g.offset_x + g.crop) * g.scale_x))

    def area(frame):  # the crop's source region to 224 with INTER_AREA, then the same normalisation
        hwc = cv2.resize(frame[y0:y1, x0:x1], (g.crop, g.crop), interpolation=cv2.INTER_AREA)
        return ((hwc[:, :, ::-1].astype(np.float32) * mul + add).transpose(2, 0, 1))[None]

    tf = T.Compose([T.Resize(cfg.resize), T.CenterCrop(cfg.crop), T.ToTensor(), T.Normalize(cfg.mean, cfg.std)])

    def pil(frame):
        return tf(Image.fromarray(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))).numpy()[None]

    return {"exact (CpuPreprocessor)": exact, "fast (service default)": fast, "cv2 INTER_AREA": area,
            "PIL / torchvision": pil}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="OpenCV threads (default 1)")
    args = parser.parse_args()
    cv2.setNumThreads(args.threads)
    import torch

    torch.set_num_threads(1)
    cfg = PreprocessConfig()
    images = photos()
    funcs = methods(cfg)
    exact = CpuPreprocessor(cfg)
    reference = [exact(f).copy() for f in images]
    diff = {name: float(np.mean([np.abs(np.asarray(fn(f)) - r).mean() for f, r in zip(images, reference)]))
            for name, fn in funcs.items()}
    samples = {name: [] for name in funcs}
    for _ in range(args.rounds):
        for name, fn in funcs.items():
            for i in range(args.frames + 5):
                frame = images[i % len(images)]
                start = time.perf_counter()
                fn(frame)
                if i >= 5:
                    samples[name].append((time.perf_counter() - start) * 1e3)
    base = np.percentile(samples["exact (CpuPreprocessor)"], 50)
    print("1280x720 -> 224x224, {} rounds x {} frames, OpenCV threads {}, ms per frame".format(
        args.rounds, args.frames, args.threads))
    print("  {:<24}{:>8}{:>8}{:>12}{:>16}".format("method", "p50", "p99", "vs exact", "mean |diff|"))
    for name, values in samples.items():
        p50, p99 = np.percentile(values, [50, 99])
        print("  {:<24}{:>8.3f}{:>8.3f}{:>11.2f}x{:>16.4f}".format(name, p50, p99, base / p50, diff[name]))
    fast = np.percentile(samples["fast (service default)"], 50)
    print("target: fast p50 <= 0.5 ms: {:.3f} ms; mean |fast - exact| <= 0.02: {:.4f}".format(
        fast, diff["fast (service default)"]))


if __name__ == "__main__":
    main()
