"""TensorRT on the device: outputs against ONNX Runtime (Polygraphy-style atol/rtol), the paired CUDA
preprocessor, manifest checks, CUDA graphs, and the 30 ms budget (INT8 vs FP16: NVIDIA/TensorRT#2197)."""

import contextlib
import json
import time
from typing import Any, Callable, Dict, Iterator, Tuple

import numpy as np
import pytest

from edge.config import PreprocessConfig, RuntimeConfig
from edge.errors import EdgeError
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend

pytestmark = [pytest.mark.jetson, pytest.mark.tensorrt]

# precision -> (atol, rtol), per element: |trt - ort| <= atol + rtol * |ort| (polygraphy run --atol --rtol).
# Starting values, not yet calibrated on a device; INT8 is judged by cosine (and by edge.model.gate on labelled images).
TOLERANCES: Dict[str, Tuple[float, float]] = {"fp32": (1e-3, 1e-3), "fp16": (0.1, 0.05)}
TIMED_FRAMES = 200


@contextlib.contextmanager
def loaded_backend(engine_path: str) -> Iterator[Any]:
    """A loaded TensorRT backend on a CUDA session of its caller's, released after the backend closes."""
    from edge.infer.cuda_session import CudaSession
    from edge.infer.tensorrt_backend import TensorRTBackend

    session = CudaSession()
    try:
        with TensorRTBackend(engine_path, session) as backend:
            yield backend
    finally:
        session.release()


def compare(precision: str, reference_model: str, engine_path: str, inputs: np.ndarray) -> None:
    with OnnxRuntimeBackend(reference_model) as ort, loaded_backend(engine_path) as trt:
        assert trt.input_shape == tuple(inputs.shape[1:])
        for tensor in inputs:
            expected, got = ort.infer(tensor), trt.infer(tensor)
            assert got.shape == expected.shape and got.dtype == np.float32
            cosine = float(np.dot(got.ravel(), expected.ravel()) /
                           (np.linalg.norm(got) * np.linalg.norm(expected)))
            print("{}: max abs diff {:.3g}, cosine {:.6f}".format(precision, float(np.abs(got - expected).max()),
                                                                 cosine))
            assert cosine >= (0.99 if precision == "int8" else 0.999)
            if precision in TOLERANCES:
                atol, rtol = TOLERANCES[precision]
                assert float((np.abs(got - expected) - (atol + rtol * np.abs(expected))).max()) <= 0.0


@contextlib.contextmanager
def gpu_path(engine_path: str, cuda_graph: bool = False) -> Iterator[Tuple[Any, Any]]:
    """(CUDA preprocessor, TensorRT backend) made, loaded and closed as edge.infer.stages makes them: both on one
    session, the preprocessor writing the engine's input dtype; closed first, the session released last."""
    from edge.infer.cuda_preprocess import CudaPreprocessor
    from edge.infer.cuda_session import CudaSession
    from edge.infer.stages import close_stages
    from edge.infer.tensorrt_backend import TensorRTBackend

    session = CudaSession()
    backend = TensorRTBackend(engine_path, session, cuda_graph)
    pre = None
    try:
        pre = CudaPreprocessor(PreprocessConfig(), session)
        loaded = backend.load()
        pre.write_as(loaded.input_dtype)
        yield pre, loaded
    finally:
        close_stages(pre, backend, session)


def stale_copy(engine_path: str, path: str) -> str:
    """A copy of the engine at `path` whose model info says it was built by another TensorRT."""
    import shutil

    from edge.store.artifact import info_path

    shutil.copy(engine_path, path)
    with open(info_path(engine_path), encoding="utf-8") as fh:
        manifest = json.load(fh)
    manifest["system"]["tensorrt"] = "0.0.0"
    with open(info_path(path), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh)
    return path


def needs_trained(precision: str, trained: bool) -> None:
    if precision != "fp32" and not trained:
        pytest.skip("untrained weights: {} logits of ~1e-10 cannot be compared (set EDGE_TEST_ONNX to a trained "
                    "model)".format(precision))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_matches_onnxruntime(precision: str, engine: Callable[[str], str], onnx_model: str, trained: bool,
                             inputs: np.ndarray) -> None:
    needs_trained(precision, trained)
    compare(precision, onnx_model, engine(precision), inputs)


def test_int8_qdq_matches_onnxruntime(engine: Callable[[str], str], qdq_model: str, trained: bool,
                                     inputs: np.ndarray) -> None:
    needs_trained("int8", trained)
    compare("int8", qdq_model, engine("int8"), inputs)


def test_describe_and_device_tensor_path(engine: Callable[[str], str], photo: Callable[[str], np.ndarray]) -> None:
    from edge.infer.preprocess import CpuPreprocessor

    with gpu_path(engine("fp32")) as (pre, backend):
        info = backend.describe()
        assert info["backend"] == "tensorrt" and info["precision"] == "fp32" and info["tensorrt"] and info["gpu"]
        frame = photo("astronaut")
        tensor = pre(frame)
        from_gpu = backend.infer(tensor)
        assert backend.engine.input_ptr() == tensor.ptr  # the preprocessor's buffer, bound in place
        assert set(backend.device_ms()) == {"infer_gpu", "preprocess_gpu"}
        from_cpu = backend.infer(CpuPreprocessor(PreprocessConfig())(frame))
        np.testing.assert_allclose(from_gpu, from_cpu, atol=1e-2, rtol=1e-2)


def test_manifest_mismatch_is_refused(engine: Callable[[str], str], tmp_path) -> None:
    path = stale_copy(engine("fp32"), str(tmp_path / "stale.engine"))
    with pytest.raises(EdgeError, match="system.tensorrt"):
        with loaded_backend(path):
            pass


def run_frames(precision_engine: str, cuda_graph: bool, frames: int = TIMED_FRAMES) -> Dict[str, float]:
    """Camera-sized frames through CudaPreprocessor + TensorRTBackend: wall-clock and device percentiles."""
    frame = np.random.default_rng(0).integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    wall, device = [], []
    with gpu_path(precision_engine, cuda_graph) as (pre, backend):
        for i in range(frames + 20):
            t0 = time.monotonic()
            backend.infer(pre(frame))
            if i >= 20:  # warm-up (and the CUDA graph decision) first
                wall.append((time.monotonic() - t0) * 1e3)
                device.append(sum(backend.device_ms().values()))
    # the figures side by side, printed: benchmarks/int8_vs_fp16.py
    return {"p50_ms": float(np.percentile(wall, 50)), "p99_ms": float(np.percentile(wall, 99)),
            "device_p50_ms": float(np.percentile(device, 50))}


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_gpu_path_within_budget(precision: str, engine: Callable[[str], str]) -> None:
    assert run_frames(engine(precision), cuda_graph=False)["p99_ms"] < RuntimeConfig().budget_ms


def test_cuda_graph_same_output_and_decision(engine: Callable[[str], str]) -> None:
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8) for _ in range(5)]
    frames += [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(3)]  # the graph ignores frame size
    outputs = []
    for graph in (False, True):
        with gpu_path(engine("fp32"), graph) as (pre, backend):
            outputs.append([backend.infer(pre(f)) for f in frames])
            status = backend.graph_status
    assert status.startswith("on") or status.startswith("off (no gain"), status
    for a, b in zip(*outputs):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def gpu_memory_used_mb() -> float:
    """Device memory in use, as the driver counts it (on Jetson: the shared RAM the GPU holds)."""
    import pycuda.driver as drv

    from edge.infer.cuda_session import CudaSession

    probe = CudaSession()
    try:
        with probe:
            free, total = drv.mem_get_info()
    finally:
        probe.release()
    return (total - free) / 2 ** 20


def test_reload_peak_memory_and_a_refused_reload_frees_everything(engine: Callable[[str], str], tmp_path) -> None:
    """The SIGHUP reload's peak (old and new stages both loaded) against one model loaded, printed for
    docs/service.md's on-paper estimate; and after a refused reload the memory is back where it was."""
    baseline = gpu_memory_used_mb()
    with gpu_path(engine("int8")):
        one = gpu_memory_used_mb()
        with gpu_path(engine("int8")):
            two = gpu_memory_used_mb()
    print("reload peak: baseline {:.0f} MB, one model +{:.0f} MB, during a reload +{:.0f} MB".format(
        baseline, one - baseline, two - baseline))
    stale = stale_copy(engine("int8"), str(tmp_path / "stale.engine"))
    with gpu_path(engine("int8")):
        serving = gpu_memory_used_mb()
        with pytest.raises(EdgeError, match="system.tensorrt"):
            with gpu_path(stale):
                pass
        assert gpu_memory_used_mb() <= serving + 16  # nothing of the refused stages is left (16 MB: allocator slack)
