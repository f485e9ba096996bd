"""FP32 ONNX -> TensorRT-compatible INT8 Q/DQ ONNX, calibrated on CPU with ONNX Runtime (default) or ModelOpt.

What TensorRT's ONNX parser accepts (tensorrt-int8.md): symmetric signed INT8 (all zero-points 0),
per-tensor activations, per-channel weights on the output-channel axis, opset 13 up to what the target TensorRT
parses, FP32 weights behind a QuantizeLinear -> DequantizeLinear pair (no INT8 initializers) and no
DequantizeLinear on biases. `quantize_qdq` asks ONNX Runtime (or NVIDIA ModelOpt, `build.quantizer`) for exactly
that and edge.model.qdq_rules.validate_qdq checks the result.

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
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

from edge.board import tensorrt_probe
from edge.config import PreprocessConfig
from edge.errors import EXIT_FAIL, EdgeError, first_line, require
from edge.infer.onnxruntime_backend import OFFLINE_THREADS, session_options
from edge.infer.preprocess import CpuPreprocessor
from edge.model.calibration import CalibrationSet
from edge.model.placement import OP_TYPES, WEIGHTED, apply_placement
from edge.model.qdq_rules import OPSET_MAX, OPSET_MIN, node_consumers, opset_of, validate_qdq
from edge.store.fileio import temp_dir

METHODS = ("minmax", "entropy", "percentile")
QUANTIZERS = ("onnxruntime", "modelopt")
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


def progress_bar(total: int, desc: str, show: bool) -> Any:
    """A tqdm bar on a terminal only: in a log or the journal, carriage-return frames are noise, and the step's
    one summary line says what happened."""
    return require("tqdm").tqdm(total=total, desc=desc, unit="img", leave=False, disable=None if show else True)


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


def sensitive_nodes(model: Any) -> List[str]:
    """MobileNetV3's nodes that PTQ hurts most, to keep in float.

    Hard-sigmoid and hard-swish (HardSwish, or x * HardSigmoid(x) depending on the exporter), the
    squeeze-excite Mul (features * HardSigmoid(gate)), the first Conv and the final classifier Gemm.
    """
    producers = {out: node for node in model.graph.node for out in node.output}
    consumers = node_consumers(model)
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


def calibration_session(calibrator: Any) -> Any:
    """The calibrator's session with graph optimisations on (ORT's own has them off), one thread not spinning, as
    the gate's (edge.model.plan.onnx_runner): a rebuild calibrates beside the running service. Measured on
    EfficientNet-Lite0, the same ranges within 1e-6 for a third of the CPU per image (benchmarks/offline_spinning.py
    --calibration)."""
    ort = require("onnxruntime")
    return ort.InferenceSession(calibrator.augmented_model_path, session_options(ort, OFFLINE_THREADS, False),
                                providers=calibrator.execution_providers)


def compute_ranges(fp32_path: str, images: CalibrationSet, preprocess: PreprocessConfig, method: str,
                   work_dir: str, show_progress: bool = True, name: Optional[str] = None) -> Any:
    """Run the calibrator over `images` -> ONNX Runtime TensorsData (per-tensor ranges). `name`: the model as
    errors name it (the user's file, when `fp32_path` is a working copy)."""
    q = require("onnxruntime.quantization")
    registry = require("onnxruntime.quantization.registry")
    op_types = sorted(set(registry.QLinearOpsRegistry) | set(registry.QDQRegistry))
    calibrator = q.create_calibrator(fp32_path, op_types,
                                     augmented_model_path=os.path.join(work_dir, "augmented.onnx"),
                                     calibrate_method=_calibration_method(method),
                                     extra_options=_calibrator_options(method))
    calibrator.infer_session = calibration_session(calibrator)
    with progress_bar(len(images), "calibrate ({})".format(method), show_progress) as bar:
        reader = PreprocessedReader(images, preprocess, calibrator.infer_session.get_inputs()[0].name,
                                    progress=bar)
        try:
            with _quiet():
                while reader.next_chunk():
                    calibrator.collect_data(reader)
                return calibrator.compute_data()
        except ValueError as exc:  # e.g. numpy "Too many bins" when activations vanish (random weights)
            raise EdgeError("{}: {} calibration failed: {}".format(name or fp32_path, method, exc),
                            exit_code=EXIT_FAIL) from None


def quantize_qdq(fp32_path: str, out_path: str, images: CalibrationSet, preprocess: PreprocessConfig,
                 method: str = "minmax", exclude_sensitive: bool = True, show_progress: bool = True,
                 log: Callable[..., None] = print, quantizer: str = "onnxruntime",
                 tensorrt: Optional[str] = None) -> Dict[str, Any]:
    """Calibrate on `images` and write a validated Q/DQ model to `out_path` (atomically). Returns a summary.

    `quantizer` (config build.quantizer): ONNX Runtime's quantize_static, or NVIDIA ModelOpt's
    (edge.model.quantize). `tensorrt`: the version the model is for, which limits its opset."""
    if quantizer == "modelopt":
        return quantize_modelopt(fp32_path, out_path, images, preprocess, method, exclude_sensitive, show_progress,
                                 log, tensorrt)
    if quantizer != "onnxruntime":
        raise EdgeError("build.quantizer: expected one of {}, got {!r}".format("|".join(QUANTIZERS), quantizer))
    onnx = require("onnx")
    q = require("onnxruntime.quantization")
    started = time.monotonic()
    model = onnx.load(fp32_path, load_external_data=False)
    opset = opset_of(model)
    if not OPSET_MIN <= opset <= OPSET_MAX:
        raise EdgeError("{}: opset {} - TensorRT Q/DQ needs {}-{} (re-export with edge export)".format(
            fp32_path, opset, OPSET_MIN, OPSET_MAX))
    has_cache = _quantize_static_has_cache()
    if method == "entropy" and not has_cache:
        raise EdgeError("build.method entropy needs onnxruntime with quantize_static(calibration_cache_path=...) "
                        "(onnxruntime {}); use minmax or percentile".format(require("onnxruntime").__version__))
    excluded = sensitive_nodes(model) if exclude_sensitive else []
    if not [n for n in model.graph.node if n.op_type in WEIGHTED and n.name not in excluded]:
        raise EdgeError("{}: every weighted layer is one build.exclude_sensitive keeps in float (first Conv, "
                        "classifier): nothing to quantise; set build.exclude_sensitive: false".format(fp32_path))
    out_dir = os.path.dirname(os.path.abspath(out_path))
    with temp_dir(out_dir, ".quantize-") as work:
        # ONNX Runtime's calibrator and quantize_static write <model>-inferred.onnx beside their input and delete it:
        # given a private copy, they never write beside the user's model (a read-only folder) nor race another build
        source, staged = os.path.join(work, "fp32.onnx"), os.path.join(work, "qdq.onnx")
        shutil.copyfile(fp32_path, source)
        kwargs: Dict[str, Any] = dict(
            quant_format=q.QuantFormat.QDQ, activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8,
            per_channel=True, reduce_range=False, nodes_to_exclude=excluded, op_types_to_quantize=list(OP_TYPES),
            calibrate_method=_calibration_method(method), extra_options=dict(EXTRA_OPTIONS))
        if has_cache:
            cache = os.path.join(work, "ranges.json")
            ranges = compute_ranges(source, images, preprocess, method, work, show_progress, name=fp32_path)
            require("onnxruntime.quantization.calibrate").save_tensors_data(ranges, cache)
            with _quiet():
                q.quantize_static(source, staged, None, calibration_cache_path=cache, **kwargs)
        else:  # older ONNX Runtime: quantize_static calibrates itself, with the same MinMax/Percentile settings
            kwargs["extra_options"].update({"CalibTensorRangeSymmetric": True, "CalibPercentile": PERCENTILE})
            with progress_bar(len(images), "calibrate ({})".format(method), show_progress) as bar, _quiet():
                reader = PreprocessedReader(images, preprocess, chunk=len(images), progress=bar)
                reader.next_chunk()
                q.quantize_static(source, staged, reader, **kwargs)
        placed = apply_placement(source, staged)
        install_validated(staged, out_path, fp32_path, tensorrt)
    return dict(summarise("onnxruntime", fp32_path, out_path, method, len(images), exclude_sensitive, excluded,
                          time.monotonic() - started, log), placement="tensorrt", moved_to_float=placed["removed"])


def install_validated(staged: str, out_path: str, fp32_path: str, tensorrt: Optional[str] = None) -> None:
    """Move `staged` to `out_path` if validate_qdq finds nothing, else one line (exit 1) with the first problem."""
    problems = validate_qdq(staged, tensorrt)
    if problems:
        raise EdgeError("{}: quantized model is not TensorRT-compatible: {}{}".format(
            fp32_path, problems[0], " (+{} more)".format(len(problems) - 1) if len(problems) > 1 else ""),
            exit_code=EXIT_FAIL)
    os.replace(staged, out_path)


def kept_in_float(excluded: List[str], shown: int = 3) -> str:
    """'2 nodes kept in float (/features/0/Conv, /classifier/Gemm)': the count and the first names."""
    names = ", ".join(excluded[:shown]) + (", +{} more".format(len(excluded) - shown) if len(excluded) > shown else "")
    return "{} node{} kept in float{}".format(len(excluded), "" if len(excluded) == 1 else "s",
                                             " ({})".format(names) if excluded else "")


def summarise(quantizer: str, fp32_path: str, out_path: str, method: str, images: int, exclude_sensitive: bool,
              excluded: List[str], seconds: float, log: Callable[..., None]) -> Dict[str, Any]:
    """The one log line and the summary the model info records (build.quantize)."""
    model = require("onnx").load(out_path, load_external_data=False)
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    log("quantize: {} -> {} ({} {}, {} images, {}, {} Q/DQ nodes) in {:.1f} s".format(
        os.path.basename(fp32_path), out_path, quantizer, method, images, kept_in_float(excluded), qdq, seconds))
    return {"quantizer": quantizer, "method": method, "images": images, "exclude_sensitive": exclude_sensitive,
            "excluded_nodes": excluded, "seconds": round(seconds, 2), "opset": opset_of(model), "qdq_nodes": qdq}


# --- NVIDIA ModelOpt (build.quantizer: modelopt, extra `modelopt`) ----------------------------------------------

MODELOPT_METHODS = {"minmax": "max", "entropy": "entropy"}  # ours -> ModelOpt's calibration_method


def _modelopt() -> Any:
    try:
        trt_utils: Any = importlib.import_module("modelopt.onnx.trt_utils")
        quantize = importlib.import_module("modelopt.onnx.quantization").quantize
    except ImportError as exc:
        raise EdgeError("build.quantizer modelopt: {} (pip install 'jetson-edge[modelopt]', or scripts/bootstrap.sh "
                        "--dev)".format(first_line(exc))) from None
    if trt_utils.TRT_PYTHON_AVAILABLE and tensorrt_probe().problem is not None:
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
    tensors = []
    with progress_bar(len(images), "calibrate (modelopt)", show_progress) as bar:
        for name in images.files:
            tensors.append(prep(images.read(name)).copy())
            bar.update(1)
    return np.concatenate(tensors)


def quantize_modelopt(fp32_path: str, out_path: str, images: CalibrationSet, preprocess: PreprocessConfig,
                      method: str = "minmax", exclude_sensitive: bool = True, show_progress: bool = True,
                      log: Callable[..., None] = print, tensorrt: Optional[str] = None) -> Dict[str, Any]:
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
    with temp_dir(os.path.dirname(os.path.abspath(out_path)), ".modelopt-") as work:
        source, staged = os.path.join(work, "fp32.onnx"), os.path.join(work, "qdq.onnx")
        shutil.copyfile(fp32_path, source)
        with _quiet(), _ort_quantizer_restored():
            quantize(source, quantize_mode="int8", calibration_data=data, calibration_method=MODELOPT_METHODS[method],
                     calibration_eps=["cpu"], nodes_to_exclude=[re.escape(n) + "$" for n in excluded],
                     output_path=staged, high_precision_dtype="fp32", log_level="ERROR")
        install_validated(staged, out_path, fp32_path, tensorrt)
    return summarise("modelopt", fp32_path, out_path, method, len(images), exclude_sensitive, excluded,
                     time.monotonic() - started, log)
