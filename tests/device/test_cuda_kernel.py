"""The fused CUDA kernel on the GPU against CpuPreprocessor: the same odd sizes and photographs as
tests/test_cuda_host_math.py, now through pycuda, pinned mapped memory and the real launch."""

import threading
from typing import Callable, Tuple

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.frame.preprocess import CpuPreprocessor

from .conftest import PHOTOS

pytestmark = pytest.mark.jetson

SIZES = ["1x1", "7x5", "200x100", "257x256", "1280x720", "720x1280", "3840x2160"]  # WxH


@pytest.fixture(scope="module")
def cuda_pre(gpu: None):
    from edge.frame.cuda_preprocess import CudaPreprocessor

    pre = CudaPreprocessor(PreprocessConfig())
    yield pre
    pre.close()


def noise(hw: Tuple[int, int]) -> np.ndarray:
    return np.random.default_rng(hw[0] * 7 + hw[1]).integers(0, 256, size=hw + (3,), dtype=np.uint8)


def make_frame(name: str, photo: Callable[[str], np.ndarray]) -> np.ndarray:
    if name in PHOTOS:
        return photo(name)
    if name == "stride":  # rows of a wider, padded buffer
        return noise((720, 1344))[:, 16:1296]
    w, h = (int(v) for v in name.split("x"))
    return noise((h, w))


@pytest.mark.parametrize("name", list(PHOTOS) + SIZES + ["stride"])
def test_kernel_matches_cpu(cuda_pre, photo: Callable[[str], np.ndarray], name: str) -> None:
    frame = make_frame(name, photo)
    got = cuda_pre(frame).download()
    diff = float(np.abs(got - CpuPreprocessor(PreprocessConfig())(frame)).max())
    print("{}: max abs diff {:.3g}, kernel {:.3f} ms".format(name, diff, cuda_pre.device_ms()))
    assert diff <= 1e-4


def test_float16_output(photo: Callable[[str], np.ndarray]) -> None:
    from edge.frame.cuda_preprocess import CudaPreprocessor

    pre = CudaPreprocessor(PreprocessConfig(), dtype=np.float16)
    try:
        frame = photo("chelsea")
        got = pre(frame).download()
        assert got.dtype == np.float16
        assert float(np.abs(got.astype(np.float32) - CpuPreprocessor(PreprocessConfig())(frame)).max()) <= 4e-3
    finally:
        pre.close()


def test_usable_from_another_thread(cuda_pre, photo: Callable[[str], np.ndarray]) -> None:
    """The context is pushed/popped per call: no 'explicit_context_dependent' errors off the creating thread."""
    frame, out = photo("coffee"), []
    worker = threading.Thread(target=lambda: out.append(cuda_pre(frame).download()))
    worker.start()
    worker.join()
    assert out and float(np.abs(out[0] - CpuPreprocessor(PreprocessConfig())(frame)).max()) <= 1e-4


def test_frame_buffer_is_zero_copy_input(cuda_pre) -> None:
    """A frame decoded straight into the pinned buffer is used in place."""
    buf = cuda_pre.frame_buffer(720, 1280)
    buf[...] = noise((720, 1280))
    expected = CpuPreprocessor(PreprocessConfig())(buf.copy())
    assert float(np.abs(cuda_pre(buf).download() - expected).max()) <= 1e-4
