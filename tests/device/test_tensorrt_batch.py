"""edge.infer.tensorrt_batch: batches on TensorRT without a GPU (not marked jetson: runs in CI), on the stand-ins
of test_simulated.py: the build asks for one optimisation profile per served size (min = opt = max), the backend
runs each size on its own execution context (profile 0, batch 1, stays the runner's), rows from the CUDA
preprocessor are copied in before it writes the next frame, a batch of 3 runs padded on the size-4 profile, one CUDA
graph per size, and everything is freed. CUDA semantics and TensorRT's own checks are the device suite's
(test_batch_device.py)."""

import sys
from typing import Any

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.infer.preprocess import CpuPreprocessor

from . import sim_gpu
from .test_simulated import ReplayGraphs, frame, host_lib, session, sim, write_engine  # noqa: F401
from fake_tensorrt import NUM_CLASSES, fake_tensorrt, reference_logits


class BuildSession:
    """The build's CudaSession surface (no calibration here: nothing is copied)."""

    def __enter__(self) -> "BuildSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def gpu_name(self) -> str:
        return "Fake GPU"

    def release(self) -> None:
        pass


@pytest.mark.parametrize("dynamic, profiles", [(True, [1, 2, 4]), (False, [])])
def test_the_build_adds_a_profile_per_served_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                  dynamic_model: str, tiny_classifiers: Any, dynamic: bool,
                                                  profiles: list) -> None:
    from edge.model import tensorrt_engine

    trt = fake_tensorrt("10.3.0")
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(tensorrt_engine, "CudaSession", BuildSession)
    assert tensorrt_engine.served_sizes(4) == [1, 2, 4] and tensorrt_engine.served_sizes(6) == [1, 2, 4, 6]
    onnx = dynamic_model if dynamic else tiny_classifiers[0]
    info = tensorrt_engine.build_engine(onnx, str(tmp_path / "m.engine"), precision="fp16", workspace_mb=64,
                                        images=None, preprocess=PreprocessConfig(), model_sha256="0" * 64,
                                        cache_dir=str(tmp_path / "cache"), log=lambda *a: None,
                                        batch_sizes=tensorrt_engine.served_sizes(4))
    asked = [shapes["input"] for name, shapes in [c for c in trt.calls if c[0] == "profile"]]
    assert asked == [((b, 3, 224, 224),) * 3 for b in profiles]  # min = opt = max = the size
    assert info["batch_sizes"] == (profiles or [1])  # what the manifest records (build.engine.batch_sizes)
    calibration = [c for c in trt.calls if c[0] == "calibration_profile"]
    assert calibration == ([("calibration_profile", {"input": ((1, 3, 224, 224),) * 3})] if dynamic else [])


def test_each_batch_size_runs_on_its_own_context_and_graph(sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                                           tmp_path: Any) -> None:
    from edge.infer import tensorrt_backend
    from edge.infer.cuda_preprocess import CudaPreprocessor

    graphs = ReplayGraphs()
    monkeypatch.setattr(tensorrt_backend, "_GraphApi", lambda: graphs)
    monkeypatch.setattr(tensorrt_backend.LoadedTensorRT, "_time_launches", lambda self, launch: 1.0)
    trt = fake_tensorrt(batch_sizes=[1, 2, 4])
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    owner = session()
    runner = tensorrt_backend.TensorRTBackend(write_engine(str(tmp_path / "model.engine")), owner, cuda_graph=True)
    pre = CudaPreprocessor(PreprocessConfig(), owner)
    cpu = CpuPreprocessor(PreprocessConfig())
    with runner as backend:
        assert backend.max_batch == 4 and backend.input_shape == (1, 3, 224, 224)
        assert backend.output_shape == (1, NUM_CLASSES)
        assert [c.profile for c in trt.contexts] == [0, 1, 2]  # the runner's (batch 1), then one per size
        assert backend.batch is not None and backend.batch.sizes == [2, 4]
        for repeat in range(2):
            for n in (1, 2, 3, 4):
                images = [frame(720, 1280, 10 * n + i + repeat) for i in range(n)]
                for row, image in enumerate(images):
                    backend.put_row(row, pre(image))  # the preprocessor's one buffer, reused row after row
                got = backend.infer_rows(n)
                expected = np.concatenate([reference_logits(cpu(image)) for image in images])
                np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
        assert sorted(backend.batch.graph_execs) == [2, 4]  # one graph per size, 3 padded to 4
        assert graphs.launches >= 3  # the second round replays them
        backend.put_row(0, cpu(images[0]))  # NumPy rows are copied in too (a CPU preprocessor beside the engine)
        backend.put_row(1, cpu(images[1]))
        np.testing.assert_allclose(backend.infer_rows(2), expected[:2], atol=1e-4, rtol=1e-4)
        pre.close()
    assert backend.batch is None and not graphs.graphs and not sim_gpu.Allocation.live
    owner.release()
    assert sim.context.detached
