"""On the device (pytest -m jetson): an engine with one optimisation profile per batch size, one execution context and
one CUDA graph per size, batches equal to the rows run alone, `edge sweep` with TensorRT, and the closed-loop
throughput cross-checked against trtexec --shapes=input:Bx3x224x224 --useCudaGraph (docs/throughput.md)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

from edge.config import PreprocessConfig

pytestmark = [pytest.mark.jetson, pytest.mark.tensorrt]
SIZES = [1, 2, 4]
HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def dynamic_onnx(onnx_model: str, tmp_path_factory: Any) -> str:
    """The test model with its batch axis made dynamic (the first input and output dimension named `batch`)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(onnx_model)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    path = str(tmp_path_factory.mktemp("dynamic") / "model.onnx")
    onnx.save(model, path)
    try:
        ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
            None, {model.graph.input[0].name: np.zeros((2, 3, 224, 224), np.float32)})
    except Exception as exc:  # a graph with its batch hard-coded (a Reshape to 1x...)
        pytest.skip("the test model does not take a batch axis: {}".format(exc))
    return path


@pytest.fixture(scope="module")
def batch_engine(dynamic_onnx: str, tmp_path_factory: Any) -> str:
    from edge.board import current_system
    from edge.model.tensorrt_engine import build_engine
    from edge.store.artifact import info_path, make_manifest
    from edge.store.fileio import write_json_atomic

    folder = tmp_path_factory.mktemp("batch-engine")
    path = str(folder / "model.fp16.engine")
    built = build_engine(dynamic_onnx, path, precision="fp16", workspace_mb=1024, images=None,
                         preprocess=PreprocessConfig(), model_sha256="0" * 64, cache_dir=str(folder / "cache"),
                         log=lambda *a: None, batch_sizes=SIZES)
    assert built["batch_sizes"] == SIZES
    write_json_atomic(info_path(path), make_manifest(path, {"trained": False}, dynamic_onnx, "tensorrt-engine",
                                                     "fp16", None, None, current_system(), {"engine": built}))
    return path


def test_one_profile_per_size_with_opt_that_size(batch_engine: str) -> None:
    import tensorrt as trt

    with open(batch_engine, "rb") as fh:
        engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(fh.read())
    assert engine.num_optimization_profiles == len(SIZES)
    name = engine.get_tensor_name(0)
    for index, size in enumerate(SIZES):
        low, opt, high = engine.get_tensor_profile_shape(name, index)
        assert low[0] == opt[0] == high[0] == size


def test_batches_equal_rows_alone_one_context_and_graph_per_size(batch_engine: str, inputs: np.ndarray) -> None:
    from edge.infer.cuda_session import CudaSession
    from edge.infer.tensorrt_backend import TensorRTBackend

    session = CudaSession()
    try:
        with TensorRTBackend(batch_engine, session, cuda_graph=True) as backend:
            assert backend.max_batch == SIZES[-1] and backend.batch is not None
            alone = np.concatenate([backend.infer(x) for x in inputs])
            for n in (1, 2, 3, 4):
                for _ in range(2):  # the second time through the captured graph
                    for row in range(n):
                        backend.put_row(row, inputs[row % len(inputs)])
                    got = backend.infer_rows(n)
                    expected = alone[[row % len(inputs) for row in range(n)]]
                    np.testing.assert_allclose(got, expected, atol=0.1, rtol=0.05)
            assert sorted(backend.batch.graph_execs) == [2, 4]
    finally:
        session.release()


def test_sweep_with_tensorrt(batch_engine: str, tmp_path: Any) -> None:
    out = str(tmp_path / "sweep.json")
    proc = subprocess.run([sys.executable, "-m", "edge", "sweep", "--model", batch_engine, "--backend", "tensorrt",
                           "--batch", "1,2,4", "--streams", "1,2,4", "--duration", "3", "--max-windows", "3",
                           "--json", out, "--csv", "", "--plot", ""], capture_output=True,
                          encoding="utf-8", errors="replace", cwd=HERE, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    for cell in json.load(open(out, encoding="utf-8"))["cells"]:
        assert cell["goodput_fps"] <= cell["achieved_fps"] <= cell["offered_fps"]


def trtexec() -> str:
    found = shutil.which("trtexec") or next((p for p in ("/usr/src/tensorrt/bin/trtexec",) if os.path.isfile(p)), None)
    if found is None:
        pytest.skip("no trtexec (JetPack: /usr/src/tensorrt/bin/trtexec)")
    return found


@pytest.mark.parametrize("size", [s for s in SIZES if s > 1])
def test_closed_loop_throughput_against_trtexec(batch_engine: str, inputs: np.ndarray, size: int) -> None:
    from edge.infer.cuda_session import CudaSession
    from edge.infer.tensorrt_backend import TensorRTBackend

    proc = subprocess.run([trtexec(), "--loadEngine=" + batch_engine, "--profile={}".format(SIZES.index(size)),
                           "--shapes=input:{}x3x224x224".format(size), "--useCudaGraph", "--duration=3",
                           "--percentile=99"], capture_output=True, encoding="utf-8", errors="replace", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    qps = float(re.search(r"Throughput: ([0-9.]+) qps", proc.stdout).group(1))
    session = CudaSession()
    try:
        with TensorRTBackend(batch_engine, session, cuda_graph=True) as backend:
            for row in range(size):
                backend.put_row(row, inputs[row % len(inputs)])
            backend.infer_rows(size)
            started, batches = time.monotonic(), 0
            while time.monotonic() - started < 3.0:
                backend.infer_rows(size)
                batches += 1
            ours = batches / (time.monotonic() - started)
    finally:
        session.release()
    # trtexec enqueues ahead and never waits on the host: ours is at most its rate, and within 3x of it
    assert qps / 3.0 <= ours <= qps * 1.2, (ours, qps)
