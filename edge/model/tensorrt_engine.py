"""Build a TensorRT engine on the device (imported only when an engine is built; tensorrt/pycuda load lazily).

Two INT8 routes:
  explicit  the Q/DQ ONNX from edge.model.quantize: INT8 (+FP16 for the layers left in float) on TensorRT
            8.5; on 10.x the float layers outside Q/DQ are pinned to FP32 (`pin_float_layers`: the Q/DQ graph's
            FP32 semantics, what the gate judged); TensorRT 11 has no precision flags and reads the precision from
            the Q/DQ graph.
  implicit  the FP32 ONNX with an IInt8EntropyCalibrator2 fed by the calibration set through the runtime's
            CpuPreprocessor (TensorRT 8.5/10.x only: 11 removed calibrators). Its cache,
            calibration/cache/<model-sha12>-trt<version>-<gpu-slug>.cache (plus a .json naming the set and
            preprocessing it came from), lets a rebuild skip calibration.
A model with a dynamic batch axis (edge export --batch dynamic) gets one optimisation profile per served size
(`served_sizes`: 1, 2, 4 ... up to runtime.batching.max_batch), each with min = opt = max = that size (a single
min=1 profile is slow at batch 4; a CUDA graph needs fixed shapes anyway); the runtime gives each its own execution
context (edge/infer/tensorrt_batch.py).
Workspace through set_memory_pool_limit; the timing cache persists beside the engine (per TensorRT version
and GPU). Parser and builder failures are one-line EdgeErrors. Every TensorRT build object is released
inside the CUDA context that made it (NVIDIA/TensorRT#2052: a context destroyed first crashes). Loading and
running an engine (verification, the gate) is edge.infer.tensorrt_runner's.
"""

import json
import os
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from edge.config import PreprocessConfig
from edge.errors import EXIT_FAIL, EdgeError
from edge.infer.cuda_session import CudaSession
from edge.infer.preprocess import CpuPreprocessor
from edge.infer.tensorrt_runner import require_tensorrt
from edge.model.calibration import CalibrationSet
from edge.model.trt_cache import read_trt_calibration_cache
from edge.store.fileio import atomic_write, write_json_atomic

if TYPE_CHECKING:
    import tensorrt as trt


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def calibration_cache_path(cache_dir: str, model_sha256: str, trt_version: str, gpu_name: str) -> str:
    return os.path.join(cache_dir, "{}-trt{}-{}.cache".format(model_sha256[:12], trt_version, slug(gpu_name)))


def timing_cache_path(engine_dir: str, trt_version: str, gpu_name: str) -> str:
    return os.path.join(engine_dir, "timing-trt{}-{}.cache".format(trt_version, slug(gpu_name)))


def _write_atomic(path: str, data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))


def _calibrator(session: CudaSession, images: CalibrationSet, preprocess: PreprocessConfig, cache_path: str,
                log: Callable[..., None]) -> "trt.IInt8EntropyCalibrator2":
    """An entropy calibrator over `images` whose cache is only reused for the same set and preprocessing."""
    import tensorrt as trt

    identity = {"calibration_sha256": images.sha256, "resize": preprocess.resize, "crop": preprocess.crop,
                "mean": list(preprocess.mean), "std": list(preprocess.std)}

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.prep = CpuPreprocessor(preprocess)
            self.index = 0
            with session:
                self.device: Any = session.drv.mem_alloc(self.prep.output.nbytes)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: List[str]) -> Optional[List[int]]:  # type: ignore[override]
            if self.index >= len(images):
                return None  # TensorRT's end-of-data signal
            tensor = self.prep(images.read(images.files[self.index]))
            self.index += 1
            session.drv.memcpy_htod(self.device, tensor)
            return [int(self.device)]

        def read_calibration_cache(self) -> Optional[bytes]:
            try:
                with open(cache_path, "rb") as fh:
                    data = fh.read()
                with open(cache_path + ".json", "r", encoding="utf-8") as fh:
                    recorded = json.load(fh)
                read_trt_calibration_cache(data)
            except (OSError, ValueError):
                return None
            if recorded != identity:
                log("calibrate: {} is from another calibration set or preprocessing; recalibrating".format(cache_path))
                return None
            log("calibrate: using {} (calibration skipped)".format(cache_path))
            return data

        def write_calibration_cache(self, cache: Any) -> None:
            _write_atomic(cache_path, bytes(cache))
            write_json_atomic(cache_path + ".json", identity, "calibration cache record")

    return EntropyCalibrator()


def served_sizes(max_batch: int) -> List[int]:
    """The batch sizes an engine gets a profile for: the powers of two below `max_batch`, and `max_batch`."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch]


def _add_profiles(builder: "trt.Builder", network: "trt.INetworkDefinition", config: "trt.IBuilderConfig",
                  sizes: Sequence[int]) -> List[int]:
    """One optimisation profile per size for an input with a dynamic batch axis (the first, batch 1, is also the
    calibration profile); the sizes the engine serves ([1] for a static input)."""
    import tensorrt as trt

    inp = network.get_input(0)
    shape = [int(inp.shape[k]) for k in range(len(inp.shape))]
    if shape[0] != -1:
        return [1]
    profiles = []
    for size in sizes:
        fixed = trt.Dims([size] + shape[1:])
        profile = builder.create_optimization_profile()
        profile.set_shape(inp.name, fixed, fixed, fixed)
        config.add_optimization_profile(profile)
        profiles.append(profile)
    if hasattr(config, "set_calibration_profile"):  # TensorRT 11 has no calibrators
        config.set_calibration_profile(profiles[0])
    return list(sizes)


def _parse_error(parser: "trt.OnnxParser", onnx_path: str) -> EdgeError:
    errors = [parser.get_error(i) for i in range(parser.num_errors)]
    if not errors:
        return EdgeError("{}: TensorRT's ONNX parser failed without an error message".format(onnx_path),
                         exit_code=EXIT_FAIL)
    first = errors[0]
    node = str(first.node_name()) if hasattr(first, "node_name") else str(first.node())
    more = " (+{} more)".format(len(errors) - 1) if len(errors) > 1 else ""
    return EdgeError("{}: TensorRT cannot parse it: {} (node {}){}".format(
        onnx_path, str(first.desc()).strip().splitlines()[0], node, more), exit_code=EXIT_FAIL)


def _set_precision(config: "trt.IBuilderConfig", precision: str, explicit: bool, version: str, onnx_path: str,
                   calibration: bool) -> str:
    """Builder flags for `precision`; returns the build mode recorded in the model info (the caller sets the
    calibrator for int8-implicit-entropy2)."""
    import tensorrt as trt

    int8_flag = getattr(trt.BuilderFlag, "INT8", None)  # both gone in TensorRT 11
    fp16_flag = getattr(trt.BuilderFlag, "FP16", None)
    if precision == "int8" and explicit:
        for flag in (int8_flag, fp16_flag):  # FP16 for the layers the Q/DQ graph leaves in float
            if flag is not None:
                config.set_flag(flag)
        return "int8-explicit-qdq"
    if precision == "int8":
        if int8_flag is None or not hasattr(config, "int8_calibrator"):
            raise EdgeError("TensorRT {} has no implicit INT8 calibration; build from the Q/DQ ONNX "
                            "(edge build --engine without --calibrator)".format(version))
        if not calibration:
            raise EdgeError("{}: float model and no calibration set: nothing to calibrate INT8 with".format(
                onnx_path))
        config.set_flag(int8_flag)
        if fp16_flag is not None:
            config.set_flag(fp16_flag)
        return "int8-implicit-entropy2"
    if precision == "fp16":
        if fp16_flag is None:
            raise EdgeError("TensorRT {} has no FP16 builder flag (weak typing was removed); "
                            "export an FP16 ONNX instead".format(version))
        config.set_flag(fp16_flag)
    return precision


def pin_float_layers(trt: Any, network: Any, config: Any) -> int:
    """A Q/DQ network on TensorRT 10: every float layer outside Q/DQ (not a Q/DQ layer, no input from a
    DequantizeLayer: the float layers the fallback and exclude_sensitive chose, GAP, SE blocks, HardSigmoid) pinned to
    FP32 with OBEY_PRECISION_CONSTRAINTS, so the builder's FP16 flag does not put them in FP16: the engine keeps the
    Q/DQ graph's FP32 semantics, which the CPU gate judged. Returns how many were pinned."""
    flag = getattr(trt.BuilderFlag, "OBEY_PRECISION_CONSTRAINTS", None)
    if flag is None:  # TensorRT 11: strongly typed, the graph's own types
        return 0
    qdq = (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE)
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    dequantized = {layer.get_output(j).name for layer in layers if layer.type == trt.LayerType.DEQUANTIZE
                   for j in range(layer.num_outputs)}
    pinned = 0
    for layer in layers:
        inputs = [layer.get_input(j) for j in range(layer.num_inputs)]
        if layer.type in qdq or any(t is not None and t.name in dequantized for t in inputs):
            continue
        if all(layer.get_output(j).dtype == trt.float32 for j in range(layer.num_outputs)):
            layer.precision = trt.float32
            pinned += 1
    if pinned:
        config.set_flag(flag)
    return pinned


def limit_tactic_sources(trt: Any, config: Any, major: int) -> List[str]:
    """The tactic sources an engine may use, by name (recorded in its model info). TensorRT 8.x turns on cuBLAS,
    cuBLASLt and cuDNN by default (10.x turned them off): an engine using cuBLAS or cuDNN loads those libraries
    into every execution context, hundreds of MB on a Jetson, twice while a reload holds two contexts (a 4 GB Orin
    Nano); those two are left out. cuBLASLt stays: it is small, loaded lazily, and MobileNetV3's head is two
    Gemm/MatMul layers whose TensorRT 8.x tactics include cuBLASLt kernels."""
    sources = getattr(trt, "TacticSource", None)
    if major >= 10 or sources is None:
        return ["tensorrt-default"]
    names = [name for name in ("CUBLAS_LT", "EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS") if hasattr(sources, name)]
    config.set_tactic_sources(sum(1 << int(getattr(sources, name)) for name in names))
    return names


def build_workspace_mb(configured_mb: int, ram_mb: Optional[int]) -> int:
    """The builder's workspace: `build.workspace_mb`, at most an eighth of the board's memory (ORT calibration and
    the builder share one process; a 4 GB board gets 512 MB)."""
    return configured_mb if not ram_mb else max(64, min(configured_mb, ram_mb // 8))


def _ram_mb(meminfo: str = "/proc/meminfo") -> Optional[int]:
    try:
        with open(meminfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _build(session: CudaSession, onnx_path: str, *, precision: str, workspace_mb: int, version: str,
           images: Optional[CalibrationSet], preprocess: PreprocessConfig, calibration_cache: str,
           timing_path: str, log: Callable[..., None], sizes: Sequence[int]) -> Tuple[bytes, bytes, Dict[str, Any]]:
    """(engine, timing cache, what the build chose: mode, batch sizes, tactic sources). Every TensorRT object lives
    in this frame only, so it is released when this returns, inside the caller's context (NVIDIA/TensorRT#2052)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(version.split(".")[0])
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH) if major < 10 else 0)
    parser = trt.OnnxParser(network, logger)  # owns the weights: kept until the build is done
    with open(onnx_path, "rb") as fh:
        if not parser.parse(fh.read()):
            raise _parse_error(parser, onnx_path)
    explicit = any(network.get_layer(i).type == trt.LayerType.QUANTIZE for i in range(network.num_layers))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    tactics = limit_tactic_sources(trt, config, major)
    mode = _set_precision(config, precision, explicit, version, onnx_path, images is not None)
    pinned = pin_float_layers(trt, network, config) if mode == "int8-explicit-qdq" and major >= 10 else 0
    served = _add_profiles(builder, network, config, sizes)
    if mode == "int8-implicit-entropy2" and images is not None:
        config.int8_calibrator = _calibrator(session, images, preprocess, calibration_cache, log)
    timing_bytes = b""
    if os.path.isfile(timing_path):
        with open(timing_path, "rb") as fh:
            timing_bytes = fh.read()
    if not config.set_timing_cache(config.create_timing_cache(timing_bytes), False):  # another TensorRT's
        log("engine: ignoring timing cache {} (does not match this TensorRT)".format(timing_path))
        config.set_timing_cache(config.create_timing_cache(b""), False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EdgeError("{}: TensorRT {} could not build an engine ({}; see its log above)".format(
            onnx_path, version, mode), exit_code=EXIT_FAIL)
    chosen = {"mode": mode, "batch_sizes": served, "tactic_sources": tactics, "fp32_pinned_layers": pinned}
    return bytes(memoryview(serialized)), bytes(memoryview(config.get_timing_cache().serialize())), chosen


def build_engine(onnx_path: str, engine_path: str, *, precision: str, workspace_mb: int,
                 images: Optional[CalibrationSet], preprocess: PreprocessConfig, model_sha256: str,
                 cache_dir: str = os.path.join("calibration", "cache"), log: Callable[..., None] = print,
                 batch_sizes: Sequence[int] = (1,)) -> Dict[str, Any]:
    """Serialize an engine for this GPU to `engine_path`. `images` selects the implicit-calibrator INT8 route;
    `batch_sizes` the profiles of a model with a dynamic batch axis; `workspace_mb` is capped by the board's memory
    (build_workspace_mb)."""
    version = require_tensorrt()
    workspace = build_workspace_mb(workspace_mb, _ram_mb())
    if workspace != workspace_mb:
        log("engine: workspace {} MB (build.workspace_mb {} MB is more than an eighth of this board's memory)".format(
            workspace, workspace_mb))
    session = CudaSession()
    try:
        with session:
            gpu = session.gpu_name()
            timing_path = timing_cache_path(os.path.dirname(os.path.abspath(engine_path)), version, gpu)
            started = time.monotonic()
            try:
                engine, timing, chosen = _build(
                    session, onnx_path, precision=precision, workspace_mb=workspace, version=version, images=images,
                    preprocess=preprocess, calibration_cache=calibration_cache_path(cache_dir, model_sha256, version,
                                                                                    gpu),
                    timing_path=timing_path, log=log, sizes=batch_sizes)
            except BaseException as exc:
                # The traceback holds _build's frame and so its TensorRT objects: drop it inside the context.
                raise exc.with_traceback(None) from None
            seconds = time.monotonic() - started
    finally:
        session.release()
    _write_atomic(engine_path, engine)
    _write_atomic(timing_path, timing)
    log("engine: {} ({}, TensorRT {}, {}) in {:.1f} s".format(engine_path, chosen["mode"], version, gpu, seconds))
    return dict(chosen, tensorrt=version, gpu=gpu, seconds=round(seconds, 1), workspace_mb=workspace,
                timing_cache=timing_path)
