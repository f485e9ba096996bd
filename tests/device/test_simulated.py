"""The GPU modules' Python logic without a GPU (not marked jetson: runs in CI).

pycuda and tensorrt are replaced by the CPU stand-ins in sim_gpu.py and tests/fake_tensorrt.py: the launcher's
packed kernel arguments drive the host build of the kernel math, module loads get the real nvcc-built images, and
the fake engine is a linear map. This checks argument order, geometry, strides, dtype, context push/pop, both
frame transfers (copy, mapped), where the kernel is loaded from and the fallback when it cannot be, engine identity,
TensorRT < 8.5 refused, and cleanup. It does not check CUDA semantics (asynchrony, real device memory),
which only tests/device on a GPU can.
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
from fake_tensorrt import ENGINE_MAGIC, NUM_CLASSES, fake_tensorrt, reference_logits

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
