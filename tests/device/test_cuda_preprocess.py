"""edge.infer.cuda_preprocess without a GPU (not marked jetson: runs in CI), on the stand-ins of test_simulated.py:
the kernel the driver's CUDA version chooses is loaded and its launch matches the CPU preprocessor, in float32 and
float16; a kernel built on the device is loaded first and a load failure is one line; frames a reader put in the
staging buffers go to the device from there, else by the copy in bands."""


import os

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.infer.preprocess import CpuPreprocessor

from . import sim_gpu, test_simulated
from .test_simulated import NVCC, frame, session

host_lib, sim = test_simulated.host_lib, test_simulated.sim  # the simulated GPU's fixtures


@pytest.mark.parametrize("driver,image", [
    (11040, "preprocess-cuda11.8-sm_87.cubin"),  # JetPack 5's driver: the NVRTC 11.8 SASS
    (12060, "preprocess-cuda12.2-sm_87.cubin"),  # JetPack 6's: the NVRTC 12.2 SASS
    (13000, "preprocess.fatbin"),  # JetPack 7's: nvcc 13's fatbin
])
def test_preprocessor_launch_matches_cpu(sim: sim_gpu.Sim, driver: int, image: str) -> None:
    """The prebuilt kernel the driver's CUDA version chooses is the one loaded (at once), and its launch, run through
    the host build of the kernel's math, matches the CPU preprocessor."""
    from edge.infer.cuda_preprocess import CudaPreprocessor

    sim.driver.get_driver_version = lambda: driver
    cpu = CpuPreprocessor(PreprocessConfig())
    padded = frame(720, 1344, 3)
    owner = session()
    pre = CudaPreprocessor(PreprocessConfig(), owner)
    with open(os.path.join(sim_gpu.CUDA_DIR, image), "rb") as fh:
        assert sim.loads == [fh.read()]
    assert sim.context_flags == sim.driver.ctx_flags.SCHED_BLOCKING_SYNC  # waits sleep, not spin
    assert pre.kernel_source.startswith("shipped edge/cuda/" + image)
    for f in (frame(720, 1280), frame(1280, 720, 1), frame(5, 7, 2), padded[:, 16:1296], frame(720, 1280, 4)):
        tensor = pre(f)
        assert tensor.shape == (1, 3, 224, 224)
        assert float(np.abs(tensor.download() - cpu(f)).max()) <= 1e-4
    assert pre.device_ms() == 0.25
    name, args = sim.launches[-1]
    assert name == "edge_preprocess_f32" and args[1:4] == (1280, 720, 1280 * 3)  # width, height, row stride
    pre.close()
    pre.close()
    assert not sim_gpu.Allocation.live and not sim.context.detached  # the session is its owner's
    owner.release()
    assert sim.context.detached


def test_kernel_built_on_the_device_is_loaded_first(sim: sim_gpu.Sim) -> None:
    from edge.infer.cuda_kernel import build_cubin, kernel_dir
    from edge.infer.cuda_preprocess import CudaPreprocessor

    if NVCC is None:
        pytest.skip("needs nvcc")
    path = build_cubin("sm_87", nvcc=NVCC)
    assert os.path.dirname(path) == kernel_dir() and os.path.basename(path).startswith("preprocess-sm_87-cuda")
    owner = session()
    pre = CudaPreprocessor(PreprocessConfig(), owner)
    assert pre.kernel_source == path and sim.loads == [open(path, "rb").read()]
    pre.close()
    owner.release()


def test_kernel_load_failure_is_one_line_at_start(sim: sim_gpu.Sim) -> None:
    from edge.infer.cuda_kernel import KernelUnavailable
    from edge.infer.cuda_preprocess import CudaPreprocessor

    sim.load_error = "cuModuleLoadData failed: device kernel image is invalid"
    owner = session()
    with pytest.raises(KernelUnavailable) as info:
        CudaPreprocessor(PreprocessConfig(), owner)
    message = str(info.value)
    assert "\n" not in message and message.startswith("no loadable preprocessing kernel for sm_87: ")
    assert "no sm_87 kernel in" in message and "device kernel image is invalid" in message
    assert not sim_gpu.Allocation.live and not sim.launches
    owner.release()


def test_float16_output(sim: sim_gpu.Sim) -> None:
    from edge.infer.cuda_preprocess import CudaPreprocessor

    owner = session()
    pre = CudaPreprocessor(PreprocessConfig(), owner, dtype=np.float16)
    f = frame(480, 640)
    got = pre(f).download()
    assert got.dtype == np.float16 and sim.launches[-1][0] == "edge_preprocess_f16"
    assert float(np.abs(got.astype(np.float32) - CpuPreprocessor(PreprocessConfig())(f)).max()) <= 4e-3
    pre.write_as(np.float32)  # the consumer takes float32 after all
    assert pre(f).download().dtype == np.float32 and sim.launches[-1][0] == "edge_preprocess_f32"
    pre.close()
    owner.release()
    assert not sim_gpu.Allocation.live


def test_a_frame_read_into_a_staging_buffer_goes_to_the_device_from_there(sim: sim_gpu.Sim) -> None:
    """The pinned-buffer path: a frame a reader put in one of the preprocessor's registered buffers is copied to the
    device from it (no host copy); any other frame takes the fallback copy; close() unregisters, the memory stays."""
    from edge.infer.cuda_preprocess import READER_BUFFERS, CudaPreprocessor

    owner = session()
    pre = CudaPreprocessor(PreprocessConfig(), owner)
    buffers = pre.staging_buffers(720, 1280)
    assert len(buffers) == READER_BUFFERS == len(sim.registered) and pre.staging_buffers(720, 1280) is buffers
    assert {b.ctypes.data for b in buffers} == sim.registered
    cpu = CpuPreprocessor(PreprocessConfig())
    for seed, buffer in enumerate(buffers):
        np.copyto(buffer, frame(720, 1280, seed))
        np.testing.assert_allclose(pre(buffer).download(), cpu(buffer), atol=2e-5)
    assert pre.copied == 0
    elsewhere = frame(720, 1280, 7)
    np.testing.assert_allclose(pre(elsewhere).download(), cpu(elsewhere), atol=2e-5)
    np.testing.assert_allclose(pre(buffers[0][:, :640]).download(), cpu(buffers[0][:, :640]), atol=2e-5)
    assert pre.copied == 2  # another frame, and a view of a staging buffer that is not the whole of it
    pre.close()
    assert not sim.registered and buffers[0].sum() > 0  # unregistered, still the reader's memory
    owner.release()


@pytest.mark.parametrize("height,width", [(5, 7), (720, 1280), (2160, 3840)])
def test_the_fallback_copy_in_bands_is_the_whole_frame(height: int, width: int) -> None:
    from edge.infer.cuda_preprocess import copy_frame

    wide = frame(height, width + 64)
    for src in (wide[:, :width].copy(), wide[:, 32:32 + width]):  # contiguous, and rows of a wider buffer
        dst = np.zeros((height, width, 3), np.uint8)
        copy_frame(dst, src)
        assert np.array_equal(dst, src)


def test_memory_the_driver_will_not_pin_leaves_frames_on_the_fallback_copy(sim: sim_gpu.Sim,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """cuMemHostRegister refused (a driver or board that cannot register host memory): no staging buffers, so the
    reader reads into its own arrays and every frame takes the fallback copy; the reason is kept."""
    from edge.infer.cuda_preprocess import CudaPreprocessor

    monkeypatch.setattr(sim.driver_library, "cuMemHostRegister_v2", lambda address, size, flags: 801)
    owner = session()
    pre = CudaPreprocessor(PreprocessConfig(), owner)
    assert pre.staging_buffers(720, 1280) == [] and pre.pin_failed == "cuMemHostRegister failed with CUDA error 801"
    f = frame(720, 1280)
    np.testing.assert_allclose(pre(f).download(), CpuPreprocessor(PreprocessConfig())(f), atol=2e-5)
    assert pre.copied == 1
    pre.close()
    owner.release()
