"""select_devices without a GPU (not marked jetson: runs everywhere). The probe is replaced where a test
needs the GPU path to look available."""

import sys

import pytest

from edge.config import load_config
from edge.errors import EdgeError
from edge.infer import select


@pytest.fixture
def gpu_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select, "gpu_unavailable", lambda: None)
    monkeypatch.setattr(select, "cuda_unavailable", lambda: None)


@pytest.fixture
def gpu_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select, "gpu_unavailable", lambda: "no CUDA device")
    monkeypatch.setattr(select, "cuda_unavailable", lambda: "no CUDA device")


def test_probe_is_importable_without_tensorrt_or_pycuda() -> None:
    reason = select.gpu_unavailable()
    assert reason is None or reason.startswith(("tensorrt not importable", "pycuda", "no CUDA device"))


def test_auto_picks_gpu_for_an_engine(gpu_present: None) -> None:
    assert select.select_devices(load_config(None, {"model.path": "m.engine"}))[:2] == ("cuda", "tensorrt")


def test_auto_falls_back_with_the_reason(gpu_absent: None) -> None:
    pre, kind, reason = select.select_devices(load_config(None, {"model.path": "m.onnx"}))
    assert (pre, kind) == ("cpu", "onnxruntime") and ".engine" in reason


def test_cuda_preprocessing_beside_onnxruntime_where_there_is_a_device(gpu_present: None) -> None:
    """The GPU check on a machine without TensorRT: the CUDA preprocessor's tensor goes back to the host."""
    pre, kind, reason = select.select_devices(load_config(None, {"preprocess.device": "cuda"}))
    assert (pre, kind) == ("cuda", "onnxruntime") and "copied back to the host" in reason


def test_cpu_preprocessing_with_tensorrt(gpu_present: None) -> None:
    cfg = load_config(None, {"model.path": "m.engine", "preprocess.device": "cpu"})
    assert select.select_devices(cfg)[:2] == ("cpu", "tensorrt")


@pytest.mark.parametrize("overrides,message", [
    ({"model.path": "m.engine", "backend.kind": "tensorrt"}, "backend.kind tensorrt is not available: no CUDA"),
    ({"model.path": "m.onnx", "backend.kind": "tensorrt"}, "needs a TensorRT .engine"),
    ({"model.path": "m.engine"}, "is a TensorRT engine, but the GPU path is unavailable: no CUDA device"),
    ({"model.path": "m.engine", "preprocess.device": "cuda"}, "GPU path is unavailable"),
    ({"preprocess.device": "cuda", "backend.kind": "onnxruntime"},
     "preprocess.device cuda beside backend onnxruntime \\(backend.kind onnxruntime configured\\) needs pycuda and "
     "a CUDA device: no CUDA device"),
    ({"preprocess.device": "cuda"}, "preprocess.device cuda beside backend onnxruntime \\(model is not a .engine"),
])
def test_explicit_gpu_choice_that_cannot_work_raises(gpu_absent: None, overrides: dict, message: str) -> None:
    with pytest.raises(EdgeError, match=message) as info:
        select.select_devices(load_config(None, overrides))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("attrs, version, problem", [
    ({"__version__": "10.3.0", "Runtime": object}, "10.3.0", None),
    ({"__version__": "8.2.1", "Runtime": object}, "8.2.1", "needs TensorRT >= 8.5"),
    ({}, None, "only type stubs are installed"),  # tensorrt-stubs alone: no Runtime, no version
])
def test_one_tensorrt_probe_answers_the_board_and_the_selection(monkeypatch: pytest.MonkeyPatch, attrs: dict,
                                                                 version: str, problem: str) -> None:
    import types

    from edge import board

    fake = types.ModuleType("tensorrt")
    fake.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    probe = board.tensorrt_probe()
    assert probe.version == version and (probe.problem is None if problem is None else problem in probe.problem)
    if problem is not None:
        assert select.gpu_unavailable() == probe.problem
