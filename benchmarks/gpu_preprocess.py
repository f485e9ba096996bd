"""GPU preprocessing of one frame to 224x224, side by side in one run, at 1280x720, 1920x1080 and 3840x2160:
CudaPreprocessor with the frame already in its pinned staging buffer (the reader read it there), the same with the
fallback host copy (a frame that arrived elsewhere), CpuPreprocessor and the service's FastPreprocessor, and where
torch imports, a user's own PyTorch pipeline on the GPU (the frame copied into a pinned tensor with copy_,
torchvision's resize(256, antialias=True), center crop, normalize). Each call is synchronised.

    python benchmarks/gpu_preprocess.py [--frames 300] [--sizes 1280x720,1920x1080,3840x2160] [--json out.json]

Per method: the call's p50 / p99 (ms), split for the CUDA ones into the staging copy (copy_frame into pinned
memory, on the threads the fallback uses), launch (the call's host time, copy excluded), sync (waiting for the
GPU) and copy+kernel (CUDA events); at 1280x720 the max and mean |GPU - CpuPreprocessor| on a photograph.
Needs pycuda, a CUDA device and the kernel (scripts/build_kernel.py); without them it prints one line naming
what is missing and exits 1.
Goal on an H200 (issue 45): ahead of the PyTorch peer, 720p p50 <= 0.2 ms, 1080p p50 <= 0.3 ms.
"""

import argparse
import json
import sys
import time
from typing import Any, Callable, Dict, List

import numpy as np

from edge.config import PreprocessConfig
from edge.infer.preprocess import CpuPreprocessor, FastPreprocessor

GOALS_MS = {"1280x720": 0.2, "1920x1080": 0.3}
CPU_FRAMES = 30  # the CPU methods are slower by far: enough for a p50


def frame_of(width: int, height: int) -> np.ndarray:
    """A photograph (scikit-image's astronaut) resized to the size, else seeded noise."""
    try:
        import cv2
        import skimage.data

        return cv2.resize(np.ascontiguousarray(skimage.data.astronaut()[:, :, ::-1]), (width, height),
                          interpolation=cv2.INTER_CUBIC)
    except ImportError:
        return np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)


def stats(times_ms: List[float]) -> Dict[str, float]:
    return {"p50": round(float(np.percentile(times_ms, 50)), 4), "p99": round(float(np.percentile(times_ms, 99)), 4)}


def time_cuda(pre: Any, frame: np.ndarray, frames: int, staged: bool) -> Dict[str, Any]:
    """The call (launch + sync) with the frame in a staging buffer or through the fallback copy, split."""
    from edge.infer.cuda_preprocess import copy_frame

    source = frame
    if staged:
        source = pre.staging_buffers(*frame.shape[:2])[0]
        np.copyto(source, frame)
    scratch = pre.staging_buffers(*frame.shape[:2])[1]
    stream = pre.session.stream
    parts: Dict[str, List[float]] = {k: [] for k in ("call", "staging_copy", "launch", "sync", "copy_kernel_gpu")}
    copied = pre.copied
    for i in range(frames + 20):
        t0 = time.perf_counter()
        if not staged:
            copy_frame(scratch, frame)  # what the fallback's copy costs, timed alone
        t1 = time.perf_counter()
        pre(source)
        t2 = time.perf_counter()
        with pre.session:
            stream.synchronize()
        t3 = time.perf_counter()
        if i >= 20:  # warmed up
            copy_ms = (t1 - t0) * 1e3
            parts["staging_copy"].append(copy_ms)
            parts["launch"].append((t2 - t1) * 1e3 - copy_ms)
            parts["sync"].append((t3 - t2) * 1e3)
            parts["call"].append((t3 - t1) * 1e3)
            parts["copy_kernel_gpu"].append(pre.device_ms())
    assert (pre.copied - copied == 0) == staged, "the staged frame was copied, or the other one was not"
    return {k: stats(v) for k, v in parts.items()}


def time_host(call: Callable[[np.ndarray], Any], frame: np.ndarray, frames: int) -> Dict[str, Any]:
    times = []
    for i in range(frames + 3):
        t0 = time.perf_counter()
        call(frame)
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    return {"call": stats(times)}


def torch_peer(cfg: PreprocessConfig) -> Any:
    """The PyTorch pipeline of issue 45, or None without torch/torchvision/CUDA."""
    try:
        import torch
        import torchvision.transforms.functional as F
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    pinned: Dict[Any, Any] = {}

    def run(frame: np.ndarray) -> Any:
        host = pinned.get(frame.shape)
        if host is None:
            host = pinned[frame.shape] = torch.empty(frame.shape, dtype=torch.uint8).pin_memory()
        host.copy_(torch.from_numpy(frame))
        t = host.cuda(non_blocking=True).permute(2, 0, 1)[[2, 1, 0]].float().div_(255.0)
        t = F.normalize(F.center_crop(F.resize(t, cfg.resize, antialias=True), cfg.crop), cfg.mean, cfg.std)
        torch.cuda.synchronize()
        return t[None]

    return run


def measure(size: str, frames: int, pre: Any, peer: Any, cfg: PreprocessConfig) -> Dict[str, Any]:
    width, height = (int(v) for v in size.split("x"))
    frame = frame_of(width, height)
    found: Dict[str, Any] = {
        "cuda, frame in staging": time_cuda(pre, frame, frames, staged=True),
        "cuda, fallback copy": time_cuda(pre, frame, frames, staged=False),
        "CpuPreprocessor": time_host(CpuPreprocessor(cfg), frame, CPU_FRAMES),
        "FastPreprocessor": time_host(FastPreprocessor(cfg), frame, CPU_FRAMES),
    }
    if peer is not None:
        found["pytorch peer"] = time_host(peer, frame, frames)
    if size == "1280x720":
        reference = CpuPreprocessor(cfg)(frame)
        diff = np.abs(pre(frame).download() - reference)
        found["diff_vs_cpu"] = {"max": float(diff.max()), "mean": float(diff.mean())}
        if peer is not None:
            found["diff_pytorch_vs_cpu"] = {"max": float(np.abs(peer(frame).cpu().numpy() - reference).max())}
    return found


def report(size: str, found: Dict[str, Any]) -> None:
    for method, parts in found.items():
        if method.startswith("diff"):
            print("{:<10} {:<24} {}".format(size, method, " ".join("{} {:.2e}".format(k, v) for k, v in parts.items())))
            continue
        split = " ".join("{} {:.3f}".format(k, v["p50"]) for k, v in parts.items() if k != "call")
        print("{:<10} {:<24} p50 {:7.3f} ms  p99 {:7.3f} ms  {}".format(
            size, method, parts["call"]["p50"], parts["call"]["p99"], "(p50: {})".format(split) if split else ""))
    goal = GOALS_MS.get(size)
    if goal is not None:
        ours = found["cuda, frame in staging"]["call"]["p50"]
        peer = found.get("pytorch peer", {}).get("call", {}).get("p50")
        print("{:<10} goal p50 <= {} ms{}: {:.3f} ms, {}".format(
            size, goal, " and ahead of PyTorch" if peer else "", ours,
            "met" if ours <= goal and (peer is None or ours < peer) else "NOT met"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--sizes", default="1280x720,1920x1080,3840x2160")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    args = parser.parse_args()
    from edge.errors import EdgeError
    from edge.infer.select import cuda_unavailable

    problem = cuda_unavailable()
    if problem is not None:
        print("gpu_preprocess: no GPU to measure on: " + problem, file=sys.stderr)
        return 1
    from edge.infer.cuda_preprocess import CudaPreprocessor
    from edge.infer.cuda_session import CudaSession

    cfg = PreprocessConfig()
    session = CudaSession()
    try:
        pre = CudaPreprocessor(cfg, session)
    except EdgeError as exc:  # no kernel for this GPU: scripts/build_kernel.py
        session.release()
        print("gpu_preprocess: " + str(exc), file=sys.stderr)
        return 1
    peer = torch_peer(cfg)
    results: Dict[str, Any] = {"gpu": session.gpu_name(), "kernel": pre.kernel_source, "frames": args.frames}
    try:
        for size in args.sizes.split(","):
            results[size] = measure(size, args.frames, pre, peer, cfg)
            report(size, results[size])
    finally:
        pre.close()
        session.release()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
