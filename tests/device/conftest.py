"""On-device fixtures, in two tiers. `pytest -m jetson tests/device` on a Jetson or any CUDA machine:

- the CUDA tier (every `jetson` test): pycuda and a CUDA device. The kernel, the CUDA session and its staging
  buffers, the doctor's gpu and kernel lines, the GPU identity;
- the TensorRT tier (`jetson` and `tensorrt`, or a test that asks for an engine): TensorRT too. Engines.

A machine with pycuda and a GPU but no TensorRT runs the first tier (`-m "jetson and not tensorrt"` selects it
alone); each skip names only what is missing. Engines are built once per session from an ONNX model:
$EDGE_TEST_ONNX, else engines/mobilenet_v3_large.onnx, else MobileNetV3-Small with seeded random weights exported
by `edge export` (needs torch).
"""

import os
from typing import Any, Callable, Dict

import numpy as np
import pytest

from edge.config import PreprocessConfig
from edge.infer.preprocess import CpuPreprocessor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "jetson: needs pycuda and a CUDA device (a Jetson or any CUDA GPU); skipped "
                                       "elsewhere")
    config.addinivalue_line("markers", "tensorrt: needs TensorRT as well (builds or runs engines)")


@pytest.fixture(scope="session")
def cuda() -> None:
    """The CUDA tier: skips, with the reason, where pycuda or a CUDA device is missing."""
    from edge.infer.select import cuda_unavailable

    problem = cuda_unavailable()
    if problem is not None:
        pytest.skip("needs pycuda and a CUDA device: " + problem)


@pytest.fixture(scope="session")
def gpu() -> None:
    """The TensorRT tier: skips naming each of TensorRT, pycuda and a CUDA device that is missing, and no other."""
    from edge.board import tensorrt_probe
    from edge.infer.select import cuda_unavailable

    missing = [p for p in (tensorrt_probe().problem, cuda_unavailable()) if p is not None]
    if missing:
        pytest.skip("needs TensorRT, pycuda and a CUDA device: " + "; ".join(missing))


@pytest.fixture(autouse=True)
def _device_tiers(request: Any) -> None:
    if request.node.get_closest_marker("tensorrt") is not None:
        request.getfixturevalue("gpu")
    elif request.node.get_closest_marker("jetson") is not None:
        request.getfixturevalue("cuda")


def read_photo(name: str) -> np.ndarray:
    import skimage.data

    return np.ascontiguousarray(getattr(skimage.data, name)()[:, :, ::-1])


@pytest.fixture(scope="session")
def photo() -> Callable[[str], np.ndarray]:
    """photo(name): a scikit-image photograph as HxWx3 uint8 BGR."""
    return read_photo


@pytest.fixture(scope="session")
def onnx_model(gpu: None, request: Any) -> str:
    path = os.environ.get("EDGE_TEST_ONNX") or os.path.join(REPO, "engines", "mobilenet_v3_large.onnx")
    if os.path.isfile(path):
        return path
    pytest.importorskip("torch", reason="no ONNX model (set EDGE_TEST_ONNX) and no torch to export one")
    return str(request.getfixturevalue("small_model"))


@pytest.fixture(scope="session")
def trained(onnx_model: str) -> bool:
    """Random weights give ~1e-10 logits (edge/build.py): FP16/INT8 numerics are meaningless on them."""
    from edge.store.artifact import read_model_info

    return bool(read_model_info(onnx_model).get("trained"))


@pytest.fixture(scope="session")
def inputs() -> np.ndarray:
    """The photographs preprocessed on the CPU: (N, 1, 3, 224, 224) float32."""
    pre = CpuPreprocessor(PreprocessConfig())
    return np.stack([pre(read_photo(name)).copy() for name in PHOTOS])


def build_engine(onnx_path: str, precision: str, out_path: str) -> str:
    """Serialised engine for `precision` (fp32: TF32 off; fp16; int8: a Q/DQ ONNX with FP16 fallback),
    written with the manifest TensorRTBackend checks."""
    import tensorrt as trt

    from edge.board import current_system
    from edge.store.artifact import info_path, make_model_info
    from edge.store.fileio import write_json_atomic

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    network = builder.create_network(0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    with open(onnx_path, "rb") as fh:
        if not parser.parse(fh.read()):
            raise AssertionError("ONNX parse failed: " + "; ".join(str(parser.get_error(i))
                                                                 for i in range(parser.num_errors)))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 30)
    flags = {"fp32": [], "fp16": ["FP16"], "int8": ["INT8", "FP16"]}[precision]
    if not all(hasattr(trt.BuilderFlag, f) for f in flags):
        pytest.skip("TensorRT {} has no BuilderFlag {} (strongly typed only)".format(trt.__version__, flags))
    for flag in flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    if precision == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    serialized = builder.build_serialized_network(network, config)
    assert serialized is not None, "TensorRT could not build a {} engine from {}".format(precision, onnx_path)
    with open(out_path, "wb") as fh:
        fh.write(bytes(serialized))
    manifest = make_model_info(out_path, {}, onnx_path, fmt="tensorrt-engine", precision=precision, calibration=None,
                               gate=None, system=current_system(), build={})
    write_json_atomic(info_path(out_path), manifest)
    return out_path


@pytest.fixture(scope="session")
def qdq_model(gpu: None, onnx_model: str, tmp_path_factory: Any) -> str:
    """A TensorRT-compatible Q/DQ INT8 ONNX made on the CPU by edge.model.quantize (skipped where it is missing)."""
    quantize = pytest.importorskip("edge.model.quantize", reason="edge.model.quantize (Q/DQ INT8 ONNX) not available")
    calibration = pytest.importorskip("edge.model.calibration", reason="edge.model.calibration not available")
    images = calibration.load_calibration_set(os.path.join(REPO, "calibration", "default"), verify=False)
    out = str(tmp_path_factory.mktemp("qdq") / "model.qdq.onnx")
    quantize.quantize_qdq(onnx_model, out, images, PreprocessConfig(), show_progress=False, log=lambda *a: None)
    return out


@pytest.fixture(scope="session")
def engine(gpu: None, onnx_model: str, tmp_path_factory: Any, request: Any) -> Callable[[str], str]:
    """engine("fp32" | "fp16" | "int8") -> path of an engine built on this device (cached per session)."""
    built: Dict[str, str] = {}

    def get(precision: str) -> str:
        if precision not in built:
            source = request.getfixturevalue("qdq_model") if precision == "int8" else onnx_model
            out = str(tmp_path_factory.mktemp("engines") / "model.{}.engine".format(precision))
            built[precision] = build_engine(source, precision, out)
        return built[precision]

    return get
