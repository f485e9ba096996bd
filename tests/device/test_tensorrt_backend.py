"""edge.infer.tensorrt_backend without a GPU (not marked jetson: runs in CI), on the stand-ins of test_simulated.py
and tests/fake_tensorrt.py: a device tensor is bound in place and an array copied in, an engine built for another
TensorRT, unloadable, stub-only or older than 8.5 is one line, and a CUDA graph is kept only when it is faster."""

import sys
import types
from typing import Any

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.errors import EdgeError
from edge.infer.preprocess import CpuPreprocessor

from . import sim_gpu, test_simulated
from .test_simulated import ReplayGraphs, frame, session, write_engine
from fake_tensorrt import NUM_CLASSES, fake_tensorrt, reference_logits

host_lib, sim = test_simulated.host_lib, test_simulated.sim  # the simulated GPU's fixtures


@pytest.mark.parametrize("input_dtype", [np.float32, np.float16])
def test_backend_paired_and_numpy_paths(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                        input_dtype: Any) -> None:
    from edge.infer.cuda_preprocess import CudaPreprocessor
    from edge.infer.tensorrt_backend import TensorRTBackend

    def no_driver() -> None:
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr("edge.infer.tensorrt_backend._GraphApi", no_driver)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(input_dtype=input_dtype))
    engine = write_engine(str(tmp_path / "model.engine"))
    owner = session()
    runner = TensorRTBackend(engine, owner, cuda_graph=True)
    pre = CudaPreprocessor(PreprocessConfig(), owner)  # before load(), as edge.infer.stages does
    cpu = CpuPreprocessor(PreprocessConfig())
    with runner as backend:
        assert backend.input_shape == (1, 3, 224, 224) and backend.output_shape == (1, NUM_CLASSES)
        pre.write_as(backend.input_dtype)
        info = backend.describe()
        assert (info["backend"], info["precision"], info["gpu"]) == ("tensorrt", "fp16", "Simulated Orin")
        for seed in range(3):
            f = frame(720, 1280, seed)
            tensor = pre(f)
            assert tensor.dtype == np.dtype(input_dtype)
            expected = reference_logits(cpu(f))
            tol = 1e-4 if input_dtype == np.float32 else 1e-2
            np.testing.assert_allclose(backend.infer(tensor), expected, atol=tol, rtol=tol)
            assert backend.engine.input_ptr() == tensor.ptr  # bound in place, no copy
            assert backend.device_ms() == {"infer_gpu": 0.25, "preprocess_gpu": 0.25}
            np.testing.assert_allclose(backend.infer(cpu(f)), expected, atol=tol, rtol=tol)  # NumPy: copied in
            assert backend.engine.input_ptr() != tensor.ptr and backend.device_ms() == {"infer_gpu": 0.25}
        assert backend.graph_status == "off (capture failed: libcuda.so.1: cannot open shared object file)"
        pre.close()
    assert sim.stream_flags == [1]  # CU_STREAM_NON_BLOCKING: legacy-stream work cannot invalidate a graph capture
    assert sim.event_flags == [1] * 4  # the timing events (preprocessor's, backend's) wait by sleeping: BLOCKING_SYNC
    assert not sim_gpu.Allocation.live and not sim.context.detached  # the session is its owner's
    owner.release()
    assert sim.context.detached


def test_manifest_mismatch_is_refused(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from edge.infer.tensorrt_backend import TensorRTBackend

    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    engine = write_engine(str(tmp_path / "model.engine"))
    monkeypatch.setattr(sys.modules["tensorrt"], "__version__", "10.4.0")  # the device was upgraded
    owner = session()
    with pytest.raises(EdgeError, match="system.tensorrt"):
        TensorRTBackend(engine, owner).load()
    owner.release()


def test_unloadable_engine_is_one_line_error(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from edge.infer.tensorrt_backend import TensorRTBackend

    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    engine = write_engine(str(tmp_path / "model.engine"), content=b"garbage")  # its model info describes it
    monkeypatch.setattr("edge.infer.tensorrt_backend.check_engine", lambda path, **kw: {})
    owner = session()
    backend = TensorRTBackend(engine, owner)
    with pytest.raises(EdgeError, match="cannot deserialise") as info:
        backend.load()
    assert "\n" not in str(info.value)
    assert not sim_gpu.Allocation.live  # what load() allocated is freed at once
    backend.close()
    owner.release()
    assert sim.context.detached


def test_stub_only_tensorrt_is_refused(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from edge.infer.tensorrt_backend import TensorRTBackend

    stub = types.ModuleType("tensorrt")  # what tensorrt-stubs alone imports as: no __file__
    monkeypatch.setitem(sys.modules, "tensorrt", stub)
    with pytest.raises(EdgeError, match="only type stubs are installed, no TensorRT runtime"):
        TensorRTBackend(str(tmp_path / "x.engine"), session()).load()


def test_tensorrt_before_8_5_is_refused(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """JetPack 5.0's TensorRT 8.4 has no named-tensor API: refused in one line, for the backend and the build."""
    from edge.infer.tensorrt_backend import TensorRTBackend
    from edge.infer.tensorrt_runner import require_tensorrt

    trt = fake_tensorrt()
    monkeypatch.setattr(trt, "__version__", "8.4.1")
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    with pytest.raises(EdgeError, match=r"tensorrt 8.4.1: jetson-edge needs TensorRT >= 8.5 \(JetPack >= 5.1\)"):
        TensorRTBackend(str(tmp_path / "x.engine"), session()).load()
    monkeypatch.setattr(trt, "__version__", "8.5.2")
    assert require_tensorrt() == "8.5.2"


@pytest.mark.parametrize("graph_ms,kept", [(0.5, True), (0.99, False)])
def test_cuda_graph_kept_only_when_faster(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                          graph_ms: float, kept: bool) -> None:
    """Only inference + output copy are captured: the preprocessor runs outside the graph, for any frame size."""
    from edge.infer import tensorrt_backend
    from edge.infer.cuda_preprocess import CudaPreprocessor

    graphs = ReplayGraphs()
    timings = iter([1.0, graph_ms])  # direct, then graph: tried once, after the first frame
    monkeypatch.setattr(tensorrt_backend, "_GraphApi", lambda: graphs)
    monkeypatch.setattr(tensorrt_backend.LoadedTensorRT, "_time_launches", lambda self, launch: next(timings))
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    owner = session()
    runner = tensorrt_backend.TensorRTBackend(write_engine(str(tmp_path / "model.engine")), owner, cuda_graph=True)
    pre = CudaPreprocessor(PreprocessConfig(), owner)
    cpu = CpuPreprocessor(PreprocessConfig())
    with runner as backend:
        for i, (h, w) in enumerate([(720, 1280)] * 4 + [(480, 640)] * 3):
            f = frame(h, w, i)
            tensor = pre(f)
            np.testing.assert_allclose(backend.infer(tensor), reference_logits(cpu(f)), atol=1e-4)
            assert backend.device_ms()["preprocess_gpu"] == 0.25
        assert backend.graph_status.startswith("on" if kept else "off (no gain")
        assert graphs.launches == (6 if kept else 0)
        assert len(graphs.graphs) == (1 if kept else 0)
        pre.close()
    owner.release()
    assert not graphs.graphs and not sim_gpu.Allocation.live
