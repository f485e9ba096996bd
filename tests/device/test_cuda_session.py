"""edge.infer.cuda_session without a GPU (not marked jetson: runs in CI), on the stand-ins of test_simulated.py: the
stages own their CUDA session and release it last and once, whether they close or fail halfway, and stages that are
refused leave no CUDA context or buffer."""

import os
import sys
import types
from typing import Any

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.errors import EdgeError

from . import sim_gpu, test_simulated
from .test_simulated import engine_with_labels
from fake_tensorrt import fake_tensorrt

host_lib, sim = test_simulated.host_lib, test_simulated.sim  # the simulated GPU's fixtures


@pytest.mark.parametrize("refusal", ["manifest for another TensorRT", "type stubs only", "int8 input"])
def test_refused_stages_leave_no_cuda_context(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                              refusal: str) -> None:
    """Stages built as `edge run` builds them at start and on SIGHUP (a preprocessor and a backend on the stages'
    session, then the backend's load): whatever refuses them, no CUDA context or buffer is left (issue 20 item 5)."""
    from edge.config import Config, ModelConfig
    from edge.infer.stages import build_stages

    monkeypatch.setattr("edge.infer.select.gpu_unavailable", lambda: None)  # the fakes have no import spec
    trt = fake_tensorrt(input_dtype=np.int8 if refusal == "int8 input" else np.float32)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    engine = engine_with_labels(tmp_path)
    if refusal == "manifest for another TensorRT":
        monkeypatch.setattr(trt, "__version__", "10.4.0")
    elif refusal == "type stubs only":
        monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    with pytest.raises(EdgeError) as info:
        build_stages(Config(model=ModelConfig(path=engine)))
    assert "\n" not in str(info.value)
    if refusal == "int8 input":
        assert str(info.value) == "{}: input 'input' is int8 1x3x224x224; jetson-edge feeds float32 or float16 " \
            "1x3xHxW".format(engine)
    assert sim.loads and not sim_gpu.Allocation.live and sim.context.detached


def record_calls(monkeypatch: pytest.MonkeyPatch, calls: list, cls: type, method: str) -> None:
    """Each call of cls.method appends the class name to `calls`, then runs it."""
    original = getattr(cls, method)

    def record(self: Any) -> None:
        calls.append(cls.__name__)
        original(self)

    monkeypatch.setattr(cls, method, record)


@pytest.mark.parametrize("ending", ["closed", "engine refused", "no labels", "kernel refused"])
def test_stages_release_their_session_last_and_once(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Any, ending: str) -> None:
    """The stages own the CUDA session: the preprocessor closes, then the backend, then the session is released,
    once, when the stages close and when building them fails halfway (issue 18 item 3)."""
    from edge.config import Config, ModelConfig
    from edge.infer.cuda_preprocess import CudaPreprocessor
    from edge.infer.cuda_session import CudaSession
    from edge.infer.stages import build_stages
    from edge.infer.tensorrt_backend import LoadedTensorRT, TensorRTBackend

    closed: list = []
    for cls, method in ((CudaPreprocessor, "close"), (TensorRTBackend, "close"), (LoadedTensorRT, "close"),
                        (CudaSession, "release")):
        record_calls(monkeypatch, closed, cls, method)
    monkeypatch.setattr("edge.infer.select.gpu_unavailable", lambda: None)  # the fakes have no import spec
    trt = fake_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    engine = engine_with_labels(tmp_path)
    cfg = Config(model=ModelConfig(path=engine), preprocess=PreprocessConfig(device="cuda"))
    if ending == "engine refused":
        monkeypatch.setattr(trt, "__version__", "10.4.0")
    elif ending == "no labels":
        os.remove(str(tmp_path / "model.labels.txt"))
    elif ending == "kernel refused":
        sim.load_error = "cuModuleLoadData failed: device kernel image is invalid"
    if ending == "closed":
        build_stages(cfg).close()
    else:
        with pytest.raises(EdgeError):
            build_stages(cfg)
    made = {"closed": ["CudaPreprocessor", "LoadedTensorRT"],  # the stages hold what the load returned
            "engine refused": ["CudaPreprocessor", "TensorRTBackend"],  # nothing loaded
            "no labels": ["CudaPreprocessor", "TensorRTBackend", "LoadedTensorRT"],  # the runner closes its load
            "kernel refused": []}[ending]
    assert closed == made + ["CudaSession"]
    assert not sim_gpu.Allocation.live and sim.context.detached  # the preprocessor and the backend freed theirs
