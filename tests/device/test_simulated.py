"""The GPU modules' Python logic without a GPU (not marked jetson: runs in CI): the stand-ins and their fixtures.

pycuda and tensorrt are replaced by the CPU stand-ins in sim_gpu.py and tests/fake_tensorrt.py: the launcher's
packed kernel arguments drive the host build of the kernel math, module loads get the real nvcc-built images, and
the fake engine is a linear map. The modules' own tests on them: test_cuda_preprocess.py, test_tensorrt_backend.py,
test_cuda_session.py and test_tensorrt_batch.py; here, what goes across them: a kernel that cannot load (auto runs
on the CPU and says why), engine identity, and CUDA preprocessing beside ONNX Runtime. None of it checks CUDA
semantics (asynchrony, real device memory), which only tests/device on a GPU can.
"""

import ctypes
import importlib.machinery
import os
import shutil
import subprocess
import sys
import types
from typing import Any, Iterator, Optional

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.errors import EdgeError
from edge.infer.preprocess import CpuPreprocessor

from . import sim_gpu
from fake_tensorrt import ENGINE_MAGIC, NUM_CLASSES, fake_tensorrt

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.isfile("/usr/local/cuda/bin/nvcc") else None)


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("needs g++")
    lib = str(tmp_path_factory.mktemp("sim") / "libhost_preprocess.so")
    subprocess.run([cxx, "-std=c++14", "-O2", "-shared", "-fPIC", "-o", lib,
                    os.path.join(sim_gpu.CUDA_DIR, "host_preprocess.cpp")], check=True)
    return ctypes.CDLL(lib)


def install(monkeypatch: pytest.MonkeyPatch, sim: sim_gpu.Sim, trt: Any = None) -> None:
    pycuda = types.ModuleType("pycuda")
    pycuda.driver = sim.driver
    for module in (pycuda, sim.driver):  # importable as real code for edge.infer.select's probe
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
        module.__file__ = sim_gpu.__file__
    for name, module in (("pycuda", pycuda), ("pycuda.driver", sim.driver), ("tensorrt", trt)):
        if module is not None:
            monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr("edge.infer.cuda_session.driver_library", lambda: sim.driver_library)


@pytest.fixture(params=[True, False], ids=["integrated", "discrete"])
def sim(request: Any, host_lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[sim_gpu.Sim]:
    monkeypatch.setenv("EDGE_KERNEL_DIR", str(tmp_path / "kernels"))
    s = sim_gpu.Sim(host_lib, integrated=request.param)
    install(monkeypatch, s)
    yield s
    assert not s.stack, "context left pushed"


def frame(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def session() -> Any:
    from edge.infer.cuda_session import CudaSession

    return CudaSession()


def write_engine(path: str, info: Optional[dict] = None, content: bytes = ENGINE_MAGIC) -> str:
    from edge.board import current_system
    from edge.store.artifact import info_path, make_model_info
    from edge.store.fileio import write_json_atomic

    with open(path, "wb") as fh:
        fh.write(content)
    onnx = path + ".onnx"
    with open(onnx, "wb") as fh:
        fh.write(b"onnx")
    write_json_atomic(info_path(path), make_model_info(path, info or {"trained": False}, onnx, fmt="tensorrt-engine",
                                                       precision="fp16", calibration=None, gate=None,
                                                       system=current_system(), build={}))
    return path


class ReplayGraphs:
    """_GraphApi stand-in: capture records what was queued, launch replays it (as a CUDA graph would)."""

    def __init__(self) -> None:
        self.graphs: dict = {}
        self.launches = 0

    def capture(self, stream: int, enqueue: Any) -> int:
        self.graphs[len(self.graphs) + 1] = enqueue
        return len(self.graphs)

    def launch(self, graph_exec: int, stream: int) -> None:
        self.launches += 1
        self.graphs[graph_exec]()

    def destroy(self, graph_exec: int) -> None:
        del self.graphs[graph_exec]


def engine_with_labels(tmp_path: Any) -> str:
    engine = write_engine(str(tmp_path / "model.engine"), {"trained": False})
    with open(str(tmp_path / "model.labels.txt"), "w", encoding="utf-8") as fh:
        fh.write("".join("class{}\n".format(i) for i in range(NUM_CLASSES)))
    return engine


@pytest.mark.parametrize("sim", [True], indirect=True, ids=["integrated"])
def test_no_kernel_auto_runs_on_cpu_and_says_why_explicit_cuda_exits_2(
        sim: sim_gpu.Sim, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture) -> None:
    """Through the real `edge run`: the kernel cannot load, so `auto` preprocesses on the CPU (the start line's
    chosen_because says why) and an explicit `cuda` is one error line, exit 2, before any frame."""
    import json

    from edge.cli.main import main

    monkeypatch.setattr("edge.infer.tensorrt_backend._GraphApi", lambda: None)
    monkeypatch.setattr("edge.infer.select.gpu_unavailable", lambda: None)  # the fakes have no import spec
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    engine = engine_with_labels(tmp_path)
    sim.load_error = "cuModuleLoadData failed: no kernel image is available for execution on the device"
    assert main(["run", "--model", engine, "--frames", "3", "--budget-ms", "1000"]) == 0
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    start = next(ln for ln in lines if ln.get("event") == "start")
    assert start["backend"] == "tensorrt" and start["preprocess"] == "cpu"
    assert "preprocessing on the CPU (preprocess.device auto): no loadable preprocessing kernel for sm_87" in \
        start["chosen_because"] and "no kernel image is available" in start["chosen_because"]
    assert not sim.launches
    assert main(["run", "--model", engine, "--frames", "3", "--preprocess", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        "edge run: error: preprocess.device cuda: no loadable preprocessing kernel for sm_87:")
    assert not sim_gpu.Allocation.live and not sim.launches


def test_engine_identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Keyed on board model, SM count, compute capability, TensorRT and CUDA; an L4T change alone is a warning."""
    from edge import board
    from edge.store import artifact

    root = tmp_path / "root"
    (root / "proc" / "device-tree").mkdir(parents=True)
    (root / "proc" / "device-tree" / "model").write_bytes(b"NVIDIA Jetson AGX Orin Developer Kit\x00")
    (root / "etc").mkdir()
    (root / "etc" / "nv_tegra_release").write_text("# R36 (release), REVISION: 4.3, GCID: 1, BOARD: generic\n",
                                                   encoding="utf-8")
    monkeypatch.setattr(board, "tensorrt_probe", lambda: board.TensorRTProbe("10.3.0", None))
    monkeypatch.setattr(board, "gpu_identity", lambda: {"gpu": "Orin", "compute_capability": "8.7", "sm_count": 16,
                                                        "cuda": "12.6"})
    built = board.current_system(str(root))
    assert {k: built[k] for k in artifact.ENGINE_SYSTEM_KEYS} == {
        "board": "NVIDIA Jetson AGX Orin Developer Kit", "sm_count": 16, "compute_capability": "8.7",
        "tensorrt": "10.3.0", "cuda": "12.6"} and built["l4t"] == "R36.4.3"
    engine = str(tmp_path / "m.engine")
    with open(engine, "wb") as fh:
        fh.write(b"engine")
    from edge.store.artifact import info_path, make_model_info
    from edge.store.fileio import write_json_atomic

    with open(engine + ".onnx", "wb") as fh:
        fh.write(b"onnx")
    write_json_atomic(info_path(engine), make_model_info(engine, {"trained": False}, engine + ".onnx",
                                                         fmt="tensorrt-engine", precision="fp16", calibration=None,
                                                         gate=None, system=built, build={}))
    warnings: list = []
    patched = dict(built, l4t="R36.4.4")  # an L4T patch with the same TensorRT and CUDA: kept, with a warning
    assert artifact.check_engine(engine, patched, warnings.append)["precision"] == "fp16"
    assert len(warnings) == 1 and "'R36.4.3', this board runs 'R36.4.4'" in warnings[0]
    for key, other in (("sm_count", 8), ("board", "NVIDIA Jetson Orin Nano Developer Kit"), ("cuda", "12.8"),
                       ("compute_capability", "11.0"), ("tensorrt", "10.7.0")):
        with pytest.raises(EdgeError, match="built for system.{} .*; rebuild with: edge build --engine".format(key)):
            artifact.check_engine(engine, dict(built, **{key: other}))


def test_cuda_preprocessing_beside_onnxruntime_downloads_the_tensor(sim: sim_gpu.Sim, small_model: str) -> None:
    """`edge run --preprocess cuda` with an ONNX model (the GPU check on a machine without TensorRT): the CUDA
    preprocessor's tensor reaches ONNX Runtime through the host, with the CPU path's logits."""
    from edge.config import load_config
    from edge.infer.stages import build_stages

    stages = build_stages(load_config(None, {"model.path": small_model, "preprocess.device": "cuda"}))
    try:
        assert (stages.preprocess_name, stages.backend.name) == ("cuda", "onnxruntime") and stages.session
        assert "copied back to the host" in stages.reason
        f = frame(720, 1280)
        expected = stages.backend.infer(CpuPreprocessor(PreprocessConfig())(f))
        np.testing.assert_allclose(stages.backend.infer(stages.preprocess(f)), expected, atol=1e-4, rtol=1e-4)
    finally:
        stages.close()
    assert not sim_gpu.Allocation.live and sim.context.detached
