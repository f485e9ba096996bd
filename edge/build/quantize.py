"""FP32 ONNX -> TensorRT-compatible INT8 Q/DQ ONNX, calibrated on CPU with ONNX Runtime (default) or ModelOpt.

What TensorRT's ONNX parser accepts (tensorrt-int8.md): symmetric signed INT8 (all zero-points 0),
per-tensor activations, per-channel weights on the output-channel axis, opset 13 up to what the target TensorRT
parses (TENSORRT_MAX_OPSET), FP32 weights behind a QuantizeLinear -> DequantizeLinear pair (no INT8 initializers)
and no DequantizeLinear on biases. `quantize_qdq` asks ONNX Runtime (or NVIDIA ModelOpt, `build.quantizer`) for
exactly that and `validate_qdq` checks the result.

Ranges are computed first with ONNX Runtime's calibrator (so entropy calibration gets 512 histogram
bins: with quantize_static's defaults its scales equal MinMax's, cpu-baseline.md) and handed to
`quantize_static` through its calibration cache.
"""

import contextlib
import importlib
import inspect
import io
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

from edge.build.calibration import CalibrationSet
from edge.config import PreprocessConfig
from edge.errors import EXIT_FAIL, EdgeError, require
from edge.frame.preprocess import CpuPreprocessor

METHODS = ("minmax", "entropy", "percentile")
QUANTIZERS = ("onnxruntime", "modelopt")
OPSET_MIN, OPSET_MAX = 13, 20  # per-axis QuantizeLinear needs 13; ORT static INT8 does not support >= 21
# The newest opset TensorRT's ONNX parser reads, from (major, minor) on: onnx-tensorrt docs/operators.md of each
# release ("TensorRT 8.5 supports operators up to Opset 17", "TensorRT 10.0 ... opset 9 to opset 20") and
# NVIDIA's ONNX Opset Guide for 11.x (25). ModelOpt's opset-19 output therefore needs TensorRT >= 10.
TENSORRT_MAX_OPSET = (((8, 5), 17), ((8, 6), 17), ((10, 0), 20), ((11, 0), 25))
ENTROPY_BINS = 512
PERCENTILE = 99.999
CHUNK = 32  # images per calibrator pass: bounds the intermediate outputs held in memory
EXTRA_OPTIONS = {
    "ActivationSymmetric": True,
    "WeightSymmetric": True,
    "AddQDQPairToWeight": True,  # FP32 weights + Q->DQ: TRT 8.x rejects INT8 weight initializers
    "DedicatedQDQPair": True,
    "QuantizeBias": False,  # a DequantizeLinear on an int32 bias is rejected by TRT
}


def _calibration_method(method: str) -> Any:
    q = require("onnxruntime.quantization")
    table = {"minmax": q.CalibrationMethod.MinMax, "entropy": q.CalibrationMethod.Entropy,
             "percentile": q.CalibrationMethod.Percentile}
    if method not in table:
        raise EdgeError("build.method: expected one of {}, got {!r}".format("|".join(METHODS), method))
    return table[method]


def _calibrator_options(method: str) -> Dict[str, Any]:
    if method == "entropy":
        return {"symmetric": True, "num_bins": ENTROPY_BINS, "num_quantized_bins": 128}
    if method == "percentile":
        return {"symmetric": True, "percentile": PERCENTILE}
    return {"symmetric": True}


class PreprocessedReader:
    """ONNX Runtime CalibrationDataReader: calibration images through the runtime's CpuPreprocessor.

    Images are read lazily, `chunk` per pass; `progress` (a tqdm bar or None) advances per image.
    """

    def __init__(self, images: CalibrationSet, preprocess: PreprocessConfig, input_name: str = "input",
                 chunk: int = CHUNK, progress: Any = None):
        self.images = images
        self.preprocess = CpuPreprocessor(preprocess)
        self.input_name = input_name
        self.chunk = chunk
        self.progress = progress
        self.position = 0
        self.limit = 0

    def next_chunk(self) -> bool:
        """Allow the next `chunk` images; False when all were read."""
        if self.position >= len(self.images):
            return False
        self.limit = min(self.position + self.chunk, len(self.images))
        return True

    def get_next(self) -> Optional[Dict[str, np.ndarray]]:
        if self.position >= self.limit:
            return None
        tensor = self.preprocess(self.images.read(self.images.files[self.position])).copy()
        self.position += 1
        if self.progress is not None:
            self.progress.update(1)
        return {self.input_name: tensor}


def _node_consumers(model: Any) -> Dict[str, List[Any]]:
    consumers: Dict[str, List[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return consumers


def sensitive_nodes(model: Any) -> List[str]:
    """MobileNetV3's nodes that PTQ hurts most, to keep in float.

    Hard-sigmoid and hard-swish (HardSwish, or x * HardSigmoid(x) depending on the exporter), the
    squeeze-excite Mul (features * HardSigmoid(gate)), the first Conv and the final classifier Gemm.
    """
    producers = {out: node for node in model.graph.node for out in node.output}
    consumers = _node_consumers(model)
    names = []
    for node in model.graph.node:
        if node.op_type in ("HardSigmoid", "HardSwish"):
            names.append(node.name)
        elif node.op_type == "Mul" and any(
                producers.get(i) is not None and producers[i].op_type == "HardSigmoid" for i in node.input):
            names.append(node.name)
    first = [n for i in model.graph.input for n in consumers.get(i.name, []) if n.op_type == "Conv"]
    last = [producers[o.name] for o in model.graph.output
            if o.name in producers and producers[o.name].op_type in ("Gemm", "MatMul")]
    names.extend(n.name for n in first + last)
    return sorted(set(n for n in names if n))


def _opset(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def max_opset(tensorrt: Optional[str]) -> int:
    """The newest opset a Q/DQ model may have for TensorRT `tensorrt` ('8.5.2', '10.3.0'); None: no target named,
    the limit ONNX Runtime's quantizer and TensorRT 10 share. Releases before 8.5 get 8.5's (they are refused
    when an engine is built)."""
    if tensorrt is None:
        return OPSET_MAX
    try:
        version = tuple(int(part) for part in (tensorrt.split(".") + ["0"])[:2])
    except ValueError:
        raise EdgeError("TensorRT version {!r}: expected MAJOR.MINOR[.PATCH]".format(tensorrt)) from None
    return max([limit for since, limit in TENSORRT_MAX_OPSET if since <= version] or [TENSORRT_MAX_OPSET[0][1]])


def _quantize_static_has_cache() -> bool:
    q = require("onnxruntime.quantization")
    return "calibration_cache_path" in inspect.signature(q.quantize_static).parameters


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ORT's quantizer logs pre-processing advice and prints histogram progress; keep the one-line-per-step log."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def compute_ranges(fp32_path: str, images: CalibrationSet, preprocess: PreprocessConfig, method: str,
                   work_dir: str, show_progress: bool = True) -> Any:
    """Run the calibrator over `images` -> ONNX Runtime TensorsData (per-tensor ranges)."""
    q = require("onnxruntime.quantization")
    registry = require("onnxruntime.quantization.registry")
    tqdm = require("tqdm").tqdm
    op_types = sorted(set(registry.QLinearOpsRegistry) | set(registry.QDQRegistry))
    calibrator = q.create_calibrator(fp32_path, op_types,
                                     augmented_model_path=os.path.join(work_dir, "augmented.onnx"),
                                     calibrate_method=_calibration_method(method),
                                     extra_options=_calibrator_options(method))
    with tqdm(total=len(images), desc="calibrate ({})".format(method), unit="img", leave=False,
              disable=not show_progress) as bar:
        reader = PreprocessedReader(images, preprocess, calibrator.infer_session.get_inputs()[0].name,
                                    progress=bar)
        try:
            with _quiet():
                while reader.next_chunk():
                    calibrator.collect_data(reader)
                return calibrator.compute_data()
        except ValueError as exc:  # e.g. numpy "Too many bins" when activations vanish (random weights)
            raise EdgeError("{}: {} calibration failed: {}".format(fp32_path, method, exc),
                            exit_code=EXIT_FAIL) from None


def quantize_qdq(fp32_path: str, out_path: str, images: CalibrationSet, preprocess: PreprocessConfig,
                 method: str = "minmax", exclude_sensitive: bool = True, show_progress: bool = True,
                 log: Callable[..., None] = print, quantizer: str = "onnxruntime") -> Dict[str, Any]:
    """Calibrate on `images` and write a validated Q/DQ model to `out_path` (atomically). Returns a summary.

    `quantizer` (config build.quantizer): ONNX Runtime's quantize_static, or NVIDIA ModelOpt's
    (edge.build.modelopt_quantize)."""
    if quantizer == "modelopt":
        return quantize_modelopt(fp32_path, out_path, images, preprocess, method, exclude_sensitive, show_progress,
                                 log)
    if quantizer != "onnxruntime":
        raise EdgeError("build.quantizer: expected one of {}, got {!r}".format("|".join(QUANTIZERS), quantizer))
    onnx = require("onnx")
    q = require("onnxruntime.quantization")
    started = time.monotonic()
    model = onnx.load(fp32_path, load_external_data=False)
    opset = _opset(model)
    if not OPSET_MIN <= opset <= OPSET_MAX:
        raise EdgeError("{}: opset {} - TensorRT Q/DQ needs {}-{} (re-export with edge export)".format(
            fp32_path, opset, OPSET_MIN, OPSET_MAX))
    has_cache = _quantize_static_has_cache()
    if method == "entropy" and not has_cache:
        raise EdgeError("build.method entropy needs onnxruntime with quantize_static(calibration_cache_path=...) "
                        "(onnxruntime {}); use minmax or percentile".format(require("onnxruntime").__version__))
    excluded = sensitive_nodes(model) if exclude_sensitive else []
    out_dir = os.path.dirname(os.path.abspath(out_path))
    with tempfile.TemporaryDirectory(prefix=".quantize-", dir=out_dir) as work:
        staged = os.path.join(work, "qdq.onnx")
        kwargs: Dict[str, Any] = dict(
            quant_format=q.QuantFormat.QDQ, activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8,
            per_channel=True, reduce_range=False, nodes_to_exclude=excluded,
            calibrate_method=_calibration_method(method), extra_options=dict(EXTRA_OPTIONS))
        if has_cache:
            cache = os.path.join(work, "ranges.json")
            ranges = compute_ranges(fp32_path, images, preprocess, method, work, show_progress)
            require("onnxruntime.quantization.calibrate").save_tensors_data(ranges, cache)
            with _quiet():
                q.quantize_static(fp32_path, staged, None, calibration_cache_path=cache, **kwargs)
        else:  # older ONNX Runtime: quantize_static calibrates itself, with the same MinMax/Percentile settings
            kwargs["extra_options"].update({"CalibTensorRangeSymmetric": True, "CalibPercentile": PERCENTILE})
            with require("tqdm").tqdm(total=len(images), desc="calibrate ({})".format(method), unit="img",
                                      leave=False, disable=not show_progress) as bar, _quiet():
                reader = PreprocessedReader(images, preprocess, chunk=len(images), progress=bar)
                reader.next_chunk()
                q.quantize_static(fp32_path, staged, reader, **kwargs)
        install_validated(staged, out_path, fp32_path)
    return summarise("onnxruntime", fp32_path, out_path, method, len(images), exclude_sensitive, excluded,
                     time.monotonic() - started, log)


def install_validated(staged: str, out_path: str, fp32_path: str) -> None:
    """Move `staged` to `out_path` if validate_qdq finds nothing, else one line (exit 1) with the first problem."""
    problems = validate_qdq(staged)
    if problems:
        raise EdgeError("{}: quantized model is not TensorRT-compatible: {}{}".format(
            fp32_path, problems[0], " (+{} more)".format(len(problems) - 1) if len(problems) > 1 else ""),
            exit_code=EXIT_FAIL)
    os.replace(staged, out_path)


def summarise(quantizer: str, fp32_path: str, out_path: str, method: str, images: int, exclude_sensitive: bool,
              excluded: List[str], seconds: float, log: Callable[..., None]) -> Dict[str, Any]:
    """The one log line and the summary the manifest records (build.quantize)."""
    model = require("onnx").load(out_path, load_external_data=False)
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    log("quantize: {} -> {} ({} {}, {} images, {} nodes kept in float, {} Q/DQ nodes) in {:.1f} s".format(
        os.path.basename(fp32_path), out_path, quantizer, method, images, len(excluded), qdq, seconds))
    return {"quantizer": quantizer, "method": method, "images": images, "exclude_sensitive": exclude_sensitive,
            "excluded_nodes": excluded, "seconds": round(seconds, 2), "opset": _opset(model), "qdq_nodes": qdq}


# --- NVIDIA ModelOpt (build.quantizer: modelopt, extra `modelopt`) ----------------------------------------------

MODELOPT_METHODS = {"minmax": "max", "entropy": "entropy"}  # ours -> ModelOpt's calibration_method


def _modelopt() -> Any:
    try:
        trt_utils: Any = importlib.import_module("modelopt.onnx.trt_utils")
        quantize = importlib.import_module("modelopt.onnx.quantization").quantize
    except ImportError as exc:
        raise EdgeError("build.quantizer modelopt: {} (pip install 'jetson-edge[modelopt]', or scripts/bootstrap.sh "
                        "--dev)".format(str(exc).splitlines()[0])) from None
    if trt_utils.TRT_PYTHON_AVAILABLE and not hasattr(trt_utils.trt, "Logger"):
        trt_utils.TRT_PYTHON_AVAILABLE = False  # tensorrt-stubs alone: no TensorRT to probe for plugins
    return quantize


@contextlib.contextmanager
def _ort_quantizer_restored() -> Iterator[None]:
    """ModelOpt patches ONNX Runtime's calibrator and quantizer classes for the whole process
    (modelopt.onnx.quantization.ort_patching.patch_ort_modules); ONNX Runtime's quantizer then fails on
    EfficientNet-Lite0 in the same process. Put every attribute back afterwards."""
    cal = require("onnxruntime.quantization.calibrate")
    owners = [cal, cal.CalibraterBase, cal.MinMaxCalibrater, cal.HistogramCalibrater, cal.HistogramCollector,
              require("onnxruntime.quantization.qdq_quantizer").QDQQuantizer,
              require("onnxruntime.quantization.base_quantizer").BaseQuantizer]
    saved = [(owner, dict(vars(owner))) for owner in owners]
    try:
        yield
    finally:
        for owner, attributes in saved:
            for name in [n for n in vars(owner) if n not in attributes and not isinstance(owner, type(cal))]:
                delattr(owner, name)
            for name, value in attributes.items():
                if vars(owner).get(name) is not value:
                    setattr(owner, name, value)


def calibration_tensors(images: CalibrationSet, preprocess: PreprocessConfig, show_progress: bool = True) -> np.ndarray:
    """(N, 3, crop, crop) float32: every calibration image through the runtime's CpuPreprocessor."""
    prep = CpuPreprocessor(preprocess)
    names = require("tqdm").tqdm(images.files, desc="calibrate (modelopt)", unit="img", leave=False,
                                 disable=not show_progress)
    return np.concatenate([prep(images.read(name)).copy() for name in names])


def quantize_modelopt(fp32_path: str, out_path: str, images: CalibrationSet, preprocess: PreprocessConfig,
                      method: str = "minmax", exclude_sensitive: bool = True, show_progress: bool = True,
                      log: Callable[..., None] = print) -> Dict[str, Any]:
    """quantize_qdq with `modelopt.onnx.quantization.quantize` (CPU). Its traps, measured with nvidia-modelopt 0.47:
    it rewrites its input file in place (onnx.shape_inference.infer_shapes_path) and writes intermediate files beside
    its output, so it gets a copy in a temporary folder and `fp32_path` is never written; its INT8 output has opset
    >= 19, which TensorRT 8.5/8.6 cannot parse (validate_qdq with the target version says so); it converts the graph
    to fp16 unless high_precision_dtype is fp32; it calibrates on cpu, cuda:0, trt unless told cpu."""
    if method not in MODELOPT_METHODS:
        raise EdgeError("build.method {}: ModelOpt calibrates with {} only".format(method, "|".join(MODELOPT_METHODS)))
    quantize = _modelopt()
    onnx = require("onnx")
    started = time.monotonic()
    model = onnx.load(fp32_path, load_external_data=False)
    excluded = sensitive_nodes(model) if exclude_sensitive else []
    data = {model.graph.input[0].name: calibration_tensors(images, preprocess, show_progress)}
    with tempfile.TemporaryDirectory(prefix=".modelopt-", dir=os.path.dirname(os.path.abspath(out_path))) as work:
        source, staged = os.path.join(work, "fp32.onnx"), os.path.join(work, "qdq.onnx")
        shutil.copyfile(fp32_path, source)
        with _quiet(), _ort_quantizer_restored():
            quantize(source, quantize_mode="int8", calibration_data=data, calibration_method=MODELOPT_METHODS[method],
                     calibration_eps=["cpu"], nodes_to_exclude=[re.escape(n) + "$" for n in excluded],
                     output_path=staged, high_precision_dtype="fp32", log_level="ERROR")
        install_validated(staged, out_path, fp32_path)
    return summarise("modelopt", fp32_path, out_path, method, len(images), exclude_sensitive, excluded,
                     time.monotonic() - started, log)


def _tensor_values(model: Any) -> Dict[str, np.ndarray]:
    numpy_helper = require("onnx.numpy_helper")
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:  # Constant nodes are initializers too, for this purpose
        if node.op_type == "Constant" and node.attribute:
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def validate_qdq(model_path: str, tensorrt: Optional[str] = None) -> List[str]:
    """Every reason TensorRT would refuse (or mis-build) this Q/DQ model; empty when it is fine.

    `tensorrt`: the target TensorRT version, whose parser limits the opset (TENSORRT_MAX_OPSET)."""
    onnx = require("onnx")
    try:
        model = onnx.load(model_path)
    except Exception as exc:  # protobuf raises its own DecodeError
        return ["not a readable ONNX model ({})".format(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)]
    problems: List[str] = []
    opset, newest = _opset(model), max_opset(tensorrt)
    if not OPSET_MIN <= opset <= newest:
        problems.append("opset {} outside {}-{}{}".format(opset, OPSET_MIN, newest, "" if tensorrt is None else
                                                           " (what TensorRT {} parses)".format(tensorrt)))
    values = _tensor_values(model)
    initializers = {i.name: i for i in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    consumers = _node_consumers(model)
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    if not any(n.op_type == "QuantizeLinear" for n in qdq):
        problems.append("no QuantizeLinear nodes: not a Q/DQ model")
    quantized_types = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT32}
    for node in qdq:
        where = "{} {}".format(node.op_type, node.name or node.output[0])
        if len(node.input) < 3 or not node.input[2]:
            problems.append("{}: no zero-point (defaults to uint8)".format(where))
        else:
            zp = values.get(node.input[2])
            if zp is None:
                problems.append("{}: zero-point is not a constant".format(where))
            elif zp.dtype != np.int8:
                problems.append("{}: zero-point is {}, TensorRT needs signed int8".format(where, zp.dtype))
            elif np.any(zp != 0):
                problems.append("{}: non-zero zero-point (asymmetric), TensorRT needs 0".format(where))
        scale = values.get(node.input[1])
        if scale is None:
            problems.append("{}: scale is not a constant".format(where))
            continue
        source = node.input[0]
        is_weight = node.op_type == "QuantizeLinear" and source in initializers
        if node.op_type == "DequantizeLinear" and source in initializers:
            init = initializers[source]
            if init.data_type in quantized_types:
                targets = [(c, list(c.input).index(node.output[0])) for c in consumers.get(node.output[0], [])]
                if any(c.op_type in ("Conv", "ConvTranspose", "Gemm") and idx == 2 for c, idx in targets):
                    problems.append("{}: DequantizeLinear on a quantized bias".format(where))
                else:
                    problems.append("{}: INT8 weight initializer '{}' (keep FP32 weights with Q->DQ)".format(
                        where, source))
            continue
        if node.op_type == "DequantizeLinear" and source in producers and producers[source].op_type == "QuantizeLinear":
            is_weight = producers[source].input[0] in initializers
        if not is_weight:
            if scale.size != 1:
                problems.append("{}: activation scale is per-channel ({} values), TensorRT needs per-tensor".format(
                    where, scale.size))
            continue
        if node.op_type != "DequantizeLinear":
            continue
        for consumer in consumers.get(node.output[0], []):
            if consumer.op_type == "Conv" and list(consumer.input).index(node.output[0]) == 1:
                weight = values.get(producers[source].input[0])
                axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
                channels = weight.shape[0] if weight is not None else -1
                if scale.size != channels or axis != 0:
                    problems.append("{}: Conv weight scale must be per-channel on axis 0 ({} channels), got {} "
                                    "values on axis {}".format(where, channels, scale.size, axis))
    for node in model.graph.node:  # biases fed by a DequantizeLinear, whatever its input
        if node.op_type in ("Conv", "ConvTranspose", "Gemm") and len(node.input) > 2 and node.input[2]:
            producer = producers.get(node.input[2])
            if producer is not None and producer.op_type == "DequantizeLinear" and \
                    producer.input[0] not in initializers:
                problems.append("{} {}: bias comes from a DequantizeLinear".format(node.op_type, node.name))
    return problems
