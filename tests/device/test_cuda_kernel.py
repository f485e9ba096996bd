"""The fused CUDA kernel on the GPU against CpuPreprocessor: the same odd sizes and photographs as
tests/test_cuda_host_math.py, now through pycuda, the kernel loaded ahead of time and the real launch; and the
kernel loaded from each of its sources (built on the device into the kernel dir, the one prebuilt for the driver's
CUDA major version)."""

import threading
from typing import Callable, Tuple

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.errors import EdgeError
from edge.infer.preprocess import CpuPreprocessor

from .conftest import PHOTOS

pytestmark = pytest.mark.jetson

SIZES = ["1x1", "7x5", "200x100", "257x256", "1280x720", "720x1280", "3840x2160"]  # WxH


@pytest.fixture(scope="module")
def session(cuda: None):
    from edge.infer.cuda_session import CudaSession

    owner = CudaSession()
    yield owner
    owner.release()


@pytest.fixture(scope="module")
def cuda_pre(session):
    from edge.infer.cuda_preprocess import CudaPreprocessor

    pre = CudaPreprocessor(PreprocessConfig(), session)
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
    assert diff <= 1e-4, "{}: max abs diff {:.3g}".format(name, diff)  # kernel times: benchmarks/gpu_preprocess.py


def test_float16_output(session, photo: Callable[[str], np.ndarray]) -> None:
    from edge.infer.cuda_preprocess import CudaPreprocessor

    pre = CudaPreprocessor(PreprocessConfig(), session, dtype=np.float16)
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


def test_frames_a_reader_put_in_the_staging_buffers_need_no_host_copy(cuda_pre) -> None:
    """The GPU path's frame: read into a page-locked staging buffer (Camera.set_staging), copied to the device from
    there, with the CPU reference's output, while the reader goes on reading into the other buffers."""
    import service_helpers as sh

    from edge.sources.capture import SyntheticCapture

    reader = sh.CameraReader(SyntheticCapture(1280, 720, fps=1000))
    reader.camera.set_staging(cuda_pre.staging_buffers)
    copied = cuda_pre.copied
    try:
        told = reader.stats()["produced"]
        assert sh.wait_until(lambda: reader.stats()["produced"] >= told + 2)  # reads begun since: staged
        reader.get()
        for _ in range(20):
            image = reader.get().image  # whole until the next batch
            got = cuda_pre(image).download()
            assert float(np.abs(got - CpuPreprocessor(PreprocessConfig())(image)).max()) <= 1e-4
    finally:
        reader.stop()
    assert cuda_pre.copied == copied


@pytest.mark.parametrize("source", ["kernel dir", "prebuilt"])
def test_kernel_loads_from_each_source(session, tmp_path, monkeypatch, photo: Callable[[str], np.ndarray],
                                       source: str) -> None:
    """Which binary this driver accepts: a cubin built here by this JetPack's nvcc, and the one prebuilt for its
    CUDA major version (edge/cuda/prebuilt.json: NVRTC 11.8 SASS, 12.2 SASS + PTX, nvcc 13's fatbin); the printed
    line says which, or why the driver refused it (the cubin built here is what the installer makes first)."""
    from edge.infer import cuda_kernel
    from edge.infer.cuda_preprocess import CudaPreprocessor

    monkeypatch.setenv("EDGE_KERNEL_DIR", str(tmp_path))
    if source == "kernel dir":
        try:
            built = cuda_kernel.build_cubin(session.arch)
        except EdgeError as exc:
            pytest.skip("no nvcc to build with: {}".format(exc))
    try:
        pre = CudaPreprocessor(PreprocessConfig(), session)
    except cuda_kernel.KernelUnavailable as exc:
        print("{}: refused by this driver: {}".format(source, exc))
        assert source == "prebuilt", str(exc)  # a cubin built here must load
        return
    try:
        print("{}: loaded {}".format(source, pre.kernel_source))
        if source == "kernel dir":
            assert pre.kernel_source == built
        else:
            assert pre.kernel_source.startswith("shipped edge/cuda/preprocess")
        frame = photo("chelsea")
        assert float(np.abs(pre(frame).download() - CpuPreprocessor(PreprocessConfig())(frame)).max()) <= 1e-4
    finally:
        pre.close()


def test_doctor_names_this_gpu_and_loads_the_kernel(session, tmp_path) -> None:
    """The doctor's gpu line names device 0 as pycuda sees it; its kernel line loads one (or names the build that
    would make one), and never says there is no device."""
    import re
    import subprocess
    import sys

    from .conftest import REPO

    proc = subprocess.run([sys.executable, "-m", "edge", "doctor", "--source", "synthetic"], capture_output=True,
                          encoding="utf-8", errors="replace", cwd=REPO, timeout=120)
    print(proc.stdout)
    gpu = re.search(r"^ok\s+gpu\s+(.*)$", proc.stdout, re.M)
    assert gpu and gpu.group(1).startswith(session.gpu_name()) and "pycuda absent" not in gpu.group(1), proc.stdout
    assert re.search(r"^(ok\s+kernel\s+loads from |warn\s+kernel\s+.*scripts/build_kernel.py)", proc.stdout, re.M)
    assert "no CUDA device" not in proc.stdout and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
