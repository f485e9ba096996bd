"""The kernel's per-pixel math (edge/cuda/preprocess.cuh), compiled for the host with g++, against
CpuPreprocessor on photographs and odd frame sizes: max abs difference <= 1e-4."""

import ctypes
import os
import shutil
import subprocess
from typing import Optional, Tuple

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.infer.preprocess import CpuPreprocessor

CUDA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "edge", "cuda")
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on PATH")
    lib = str(tmp_path_factory.mktemp("host_math") / "libedge_host_preprocess.so")
    subprocess.run([cxx, "-std=c++14", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic", "-shared", "-fPIC",
                    "-o", lib, os.path.join(CUDA_DIR, "host_preprocess.cpp")], check=True)
    return ctypes.CDLL(lib)


def host_preprocess(lib: ctypes.CDLL, frame: np.ndarray, cfg: PreprocessConfig) -> np.ndarray:
    """Same arguments the CUDA launcher passes to the kernel: geometry from crop_geometry, row stride."""
    assert frame.dtype == np.uint8 and frame.strides[1:] == (3, 1)
    cpu = CpuPreprocessor(cfg)
    g = cpu.geometry(frame.shape)
    out = np.empty((1, 3, cfg.crop, cfg.crop), np.float32)
    fp = ctypes.POINTER(ctypes.c_float)
    lib.edge_preprocess_host(
        ctypes.c_void_p(frame.ctypes.data), g.src_w, g.src_h, frame.strides[0],
        ctypes.c_double(g.scale_x), ctypes.c_double(g.scale_y), g.offset_x, g.offset_y, g.crop,
        cpu.mul.ctypes.data_as(fp), cpu.add.ctypes.data_as(fp), out.ctypes.data_as(fp))
    return out


def max_diff(lib: ctypes.CDLL, frame: np.ndarray, cfg: Optional[PreprocessConfig] = None) -> float:
    cfg = cfg or PreprocessConfig()
    expected = CpuPreprocessor(cfg)(frame)
    got = host_preprocess(lib, frame, cfg)
    assert np.isfinite(got).all()
    return float(np.abs(got - expected).max())


def noise(shape: Tuple[int, int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape + (3,), dtype=np.uint8)


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee", "rocket"])
def test_photographs(host_lib: ctypes.CDLL, name: str) -> None:
    data = pytest.importorskip("skimage.data")
    bgr = np.ascontiguousarray(getattr(data, name)()[:, :, ::-1])
    assert max_diff(host_lib, bgr) <= TOLERANCE


@pytest.mark.parametrize("hw", [
    (1, 1),  # one pixel stretched over the whole crop
    (5, 7), (100, 200), (200, 100),  # smaller than the crop
    (256, 256), (256, 257), (257, 256), (299, 301),  # crop near the edges, odd offsets (round half to even)
    (2160, 3840),  # 4K landscape
    (1280, 720),  # portrait
], ids=lambda hw: "{}x{}".format(hw[1], hw[0]))
def test_odd_sizes(host_lib: ctypes.CDLL, hw: Tuple[int, int]) -> None:
    assert max_diff(host_lib, noise(hw)) <= TOLERANCE


def test_crop_equals_resize(host_lib: ctypes.CDLL) -> None:
    """The crop reaches every edge of the resized image."""
    assert max_diff(host_lib, noise((480, 640), 1), PreprocessConfig(resize=224, crop=224)) <= TOLERANCE


def test_row_stride(host_lib: ctypes.CDLL) -> None:
    """A frame that is a view into a wider, padded buffer: rows are not contiguous."""
    padded = noise((720, 1344), 2)
    frame = padded[:, 16:1296]
    assert not frame.flags.c_contiguous and frame.strides[0] == 1344 * 3
    assert max_diff(host_lib, frame) <= TOLERANCE


def test_custom_normalisation(host_lib: ctypes.CDLL) -> None:
    cfg = PreprocessConfig(resize=160, crop=128, mean=[0.5, 0.5, 0.5], std=[0.5, 0.25, 0.125])
    assert max_diff(host_lib, noise((480, 640), 3), cfg) <= TOLERANCE
