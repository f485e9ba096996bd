"""What a build makes and from what: the format table, and every input checked before any work (`check_inputs`).

One row per artifact format says everything that differs between them; nothing else branches on the format:

    format           suffix   made by                              judged (gate, verify) with
    onnx-qdq         .onnx    the Q/DQ model itself (CPU)          ONNX Runtime
    tensorrt-engine  .engine  edge.model.tensorrt_engine (device)  edge.infer.tensorrt_runner.EngineRunner
"""

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

from edge.board import tensorrt_probe
from edge.config import Config
from edge.errors import EdgeError, first_line, require
from edge.infer.stages import config_for_model
from edge.model.artifacts import verify_onnx
from edge.model.calibration import CalibrationSet, load_calibration_set
from edge.model.gate import Infer, resolve_labels
from edge.model.gate_looks import ledger_path, next_look
from edge.model.gate_report import report_path
from edge.model.qdq_rules import OPSET_MAX, OPSET_MIN, max_opset
from edge.store.artifact import engine_expectations, is_current, read_set, sha256_file
from edge.store.versions import recover_folder

Log = Callable[..., None]
_PRECISION_SUFFIX = re.compile(r"\.(int8|fp16|fp32)$")


def onnx_runner(path: str) -> ContextManager[Infer]:
    """ONNX Runtime; a Q/DQ model as TensorRT computes it (emulated), whatever this CPU's int8 kernels do. One
    thread (OFFLINE_THREADS), not spinning: the gate alternates two sessions, and on a busy build machine spinning
    made it 1.8x slower (benchmarks/offline_spinning.py)."""
    from edge.infer.onnxruntime_backend import OFFLINE_THREADS, OnnxRuntimeBackend

    return OnnxRuntimeBackend(path, OFFLINE_THREADS, spinning=False, emulate_int8=True)


def fused_runner(path: str) -> ContextManager[Infer]:
    """The Q/DQ model on this CPU's fused ONNX Runtime int8 kernels (session.x64quantprecision on), as `edge run`
    serves it where they do not saturate."""
    from edge.infer.onnxruntime_backend import OFFLINE_THREADS, OnnxRuntimeBackend

    return OnnxRuntimeBackend(path, OFFLINE_THREADS, spinning=False, emulate_int8=False)


def _engine_runner(path: str) -> ContextManager[Infer]:
    from edge.infer.tensorrt_runner import EngineRunner

    return EngineRunner(path)


def _verify_engine(path: str) -> None:
    from edge.infer.tensorrt_runner import verify_engine

    verify_engine(path)


def _require_device() -> None:
    from edge.infer.tensorrt_runner import require_tensorrt

    require_tensorrt()
    require("pycuda.driver")


@dataclass(frozen=True)
class Format:
    name: str  # the model info's "format"
    suffix: str  # artifact file extension
    flag: str  # how `edge build` asks for it
    precisions: Tuple[str, ...]
    calibrator: bool  # TensorRT's implicit calibrator (--calibrator) applies
    tied_to_board: bool  # runs only on the board/SMs/compute capability/TensorRT/CUDA it was built on
    require: Callable[[], None]  # what this machine needs to build it
    runner: Callable[[str], ContextManager[Infer]]  # how the gate and the latency check run it
    verify: Callable[[str], None]  # install's check of the staged file
    engine: bool  # made by the TensorRT builder step
    evaluator: str  # what computes the candidate's outputs in the gate (its report says so)


FORMATS = {
    "onnx-qdq": Format("onnx-qdq", ".onnx", "", ("int8",), False, False, lambda: None, onnx_runner, verify_onnx,
                       False, "onnxruntime, Q/DQ emulated as float fake-quantisation (TensorRT's int8 arithmetic, "
                              "the same on every CPU)"),
    "tensorrt-engine": Format("tensorrt-engine", ".engine", "--engine", ("int8", "fp16", "fp32"), True, True,
                              _require_device, _engine_runner, _verify_engine, True, "the TensorRT engine on this GPU"),
}


def format_for(engine: bool) -> Format:
    return FORMATS["tensorrt-engine" if engine else "onnx-qdq"]


def source_model(model_path: str) -> str:
    """The FP32 ONNX behind a configured model path: engines/m.int8.engine -> engines/m.onnx."""
    return _PRECISION_SUFFIX.sub("", os.path.splitext(model_path)[0]) + ".onnx"


def artifact_path(source: str, engines_dir: str, precision: str, fmt: Format) -> str:
    stem = os.path.splitext(os.path.basename(source))[0]
    return os.path.join(engines_dir, "{}.{}{}".format(stem, precision, fmt.suffix))


@dataclass(frozen=True)
class BuildPlan:
    """Everything a build needs, checked up front by `check_inputs`."""

    cfg: Config
    fmt: Format
    source: str
    artifact: str
    calibrator: bool  # TensorRT implicit calibration instead of the Q/DQ model
    source_info: Dict[str, Any]
    labels: Optional[List[str]]
    calibration: Optional[CalibrationSet]  # None: not needed, or made by a step (edge rebuild's capture)
    regression: CalibrationSet
    command: str  # what rebuilds it
    target_tensorrt: Optional[str] = None  # the TensorRT the artifact is for (limits the Q/DQ opset)
    show_progress: bool = True
    accept_inconclusive: bool = False  # --accept-inconclusive: a gate that cannot tell still installs, recorded
    looks_path: str = ""  # the ledger of this source's looks at this regression set (edge.model.gate_looks); "":
    # none kept (a declared-untrained model)

    @property
    def report_path(self) -> str:
        return report_path(self.artifact)

    @property
    def gate_enforced(self) -> bool:
        """Always, unless the model is declared untrained (--untrained, or its model info says so): a model without
        model info is gated, and untrained weights are recognised from their outputs (edge.model.gate)."""
        return self.source_info.get("trained") is not False

    @property
    def quantizes(self) -> bool:
        """The Q/DQ model is made on the CPU (INT8 without TensorRT's own calibrator)."""
        return self.cfg.build.precision == "int8" and not self.calibrator

    @property
    def calibration_method(self) -> str:
        return "tensorrt-entropy2" if self.calibrator else self.cfg.build.method


def rebuild_command(cfg: Config, model: Optional[str], fmt: Format, *, calibrator: bool,
                    untrained: bool = False) -> str:
    parts = ["edge build"] + (["--config " + cfg.path] if cfg.path else []) + (["--model " + model] if model else [])
    return " ".join(parts + [p for p in (fmt.flag, "--calibrator" if calibrator else "",
                                         "--untrained" if untrained else "") if p])


def target_tensorrt(cfg: Config) -> Optional[str]:
    """The TensorRT version the build is for: build.target_tensorrt, else this machine's, else None (no limit
    beyond what ONNX Runtime's quantizer makes)."""
    target = cfg.build.target_tensorrt or tensorrt_probe().version
    if target:
        try:
            max_opset(target)
        except EdgeError:
            raise EdgeError("build.target_tensorrt {!r} in {}: expected MAJOR.MINOR[.PATCH], e.g. 8.5 (JetPack 5), "
                            "10.3 (JetPack 6)".format(target, cfg.path or "<defaults>")) from None
    return target or None


def check_source(source: str, crop: int, where: str, tensorrt: Optional[str] = None) -> None:
    onnx = require("onnx")
    if not os.path.isfile(source):
        raise EdgeError("{}: source model not found (model.path or --model in {}; create it with: edge export)".format(
            source, where))
    if not source.endswith(".onnx"):
        raise EdgeError("{}: the build starts from an FP32 .onnx (--model)".format(source))
    try:
        model = onnx.load(source)
        onnx.checker.check_model(model)
    except Exception as exc:  # protobuf DecodeError, onnx ValidationError
        raise EdgeError("{}: not a valid ONNX model: {}".format(source, first_line(exc))) from None
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        raise EdgeError("{}: already quantized; point --model at the FP32 export".format(source))
    opset, newest = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0), \
        min(OPSET_MAX, max_opset(tensorrt))
    if not OPSET_MIN <= opset <= newest:
        raise EdgeError("{}: opset {}, INT8 Q/DQ {} needs {}-{} (re-export with: edge export)".format(
            source, opset, "for TensorRT {}".format(tensorrt) if tensorrt else "", OPSET_MIN, newest))
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    dims = [d.dim_value for d in inputs[0].type.tensor_type.shape.dim] if len(inputs) == 1 else []
    if dims[:1] == [0] and inputs[0].type.tensor_type.shape.dim[0].dim_param:  # a batch axis: the build feeds batch 1
        dims[0] = 1
    if dims != [1, 3, crop, crop]:
        raise EdgeError("{}: input shape {} does not match preprocess.crop {} in {} (expected [1, 3, {}, {}])".format(
            source, dims or "(not one input)", crop, where, crop, crop))


def source_model_info(source: str, info: Dict[str, Any], *, untrained: bool = False) -> Dict[str, Any]:
    """The source's model info (`info`, read with its set; none beside it: a user's own ONNX, "yours (no model
    info)", gated as trained). `untrained` (--untrained): declared untrained, so the gate is reported and not
    enforced."""
    if untrained:
        info = dict(info, trained=False, weights="{} (declared untrained: --untrained)".format(info.get("weights")))
    return info


def check_inputs(cfg: Config, model: Optional[str] = None, *, engine: bool = False, calibrator: bool = False,
                 show_progress: bool = True, load_calibration: bool = True, untrained: bool = False,
                 accept_inconclusive: bool = False) -> BuildPlan:
    """Validate every input before any work; each problem is one line naming the file or config field.

    `load_calibration=False`: the calibration set is made later by a step (edge rebuild's capture). `untrained`,
    `accept_inconclusive`: the build's --untrained and --accept-inconclusive."""

    b, fmt = cfg.build, format_for(engine)
    where = cfg.path or "<defaults>"
    source = model or source_model(cfg.model.path)
    if not os.path.isfile(source):
        raise EdgeError("{}: source model not found (model.path or --model in {}; create it with: edge export)".format(
            source, where))
    # the source's set read once: its model info, labels and bytes checked together; its own preprocessing
    # constants drive calibration and the gate, as at run time
    source_set = read_set(source, rebuild="edge export")
    source_info = source_model_info(source, source_set.info, untrained=untrained)
    cfg = config_for_model(cfg, source_info, source)
    if b.precision not in fmt.precisions:
        raise EdgeError("build.precision {} in {}: the CPU build makes INT8 Q/DQ models only; fp16/fp32 engines "
                        "need --engine on the device".format(b.precision, where))
    if calibrator and not (fmt.calibrator and b.precision == "int8"):
        raise EdgeError("--calibrator: TensorRT calibration applies to INT8 engines only "
                        "(--engine, build.precision int8)")
    tensorrt = target_tensorrt(cfg)
    check_source(source, cfg.preprocess.crop, where, tensorrt)
    for folder in (b.calibration_dir, b.regression_dir):
        recover_folder(folder)  # a set a killed `calibrate import`/capture/rebuild left aside goes back first
    calibration = None
    if b.precision == "int8" and load_calibration:
        calibration = load_calibration_set(b.calibration_dir, b.min_images,
                                           what="calibration set (build.calibration_dir in {})".format(where))
    regression = load_calibration_set(
        b.regression_dir, 1, what="regression set (build.regression_dir in {})".format(where),
        hint="make the labelled ImageNet set with: edge calibrate imagenet {0}, or label your own images "
             "(<label>/<image>): edge calibrate import IMAGES_DIR {0}".format(b.regression_dir))
    labels = source_set.labels
    resolve_labels(regression, labels)
    try:
        os.makedirs(b.engines_dir, exist_ok=True)
    except OSError as exc:
        raise EdgeError("build.engines_dir {}: cannot create it ({})".format(b.engines_dir, exc.strerror)) from None
    if not os.access(b.engines_dir, os.W_OK):
        raise EdgeError("build.engines_dir {}: not writable".format(b.engines_dir))
    fmt.require()
    looks_path = ""  # a declared-untrained model's gate is not enforced: its looks prove nothing and cost nothing
    if source_info.get("trained") is not False:
        looks_path = ledger_path(b.engines_dir, sha256_file(source), regression.sha256)
        next_look(looks_path)  # a spent set is refused before any work
    return BuildPlan(cfg=cfg, fmt=fmt, source=source, artifact=artifact_path(source, b.engines_dir, b.precision, fmt),
                     calibrator=calibrator, source_info=source_info, labels=labels,
                     calibration=calibration, regression=regression,
                     command=rebuild_command(cfg, model, fmt, calibrator=calibrator, untrained=untrained),
                     target_tensorrt=tensorrt, show_progress=show_progress, accept_inconclusive=accept_inconclusive,
                     looks_path=looks_path)


def expected_model_info(plan: BuildPlan, system: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """What an installed artifact must record to count as built from this plan's inputs on this system."""
    b = plan.cfg.build
    expected: Dict[str, Any] = {"source.sha256": sha256_file(plan.source), "precision": b.precision,
                                "format": plan.fmt.name}
    if plan.calibration is not None:
        expected["calibration.sha256"] = plan.calibration.sha256
        expected["calibration.method"] = plan.calibration_method
        expected["calibration.exclude_sensitive"] = None if plan.calibrator else b.exclude_sensitive
    if plan.fmt.tied_to_board:
        expected.update(engine_expectations(system))
    return expected


def artifact_status(cfg: Config, model: Optional[str] = None, *, engine: bool = False,
                    calibrator: bool = False) -> Tuple[bool, str]:
    """(current?, reason) for the artifact this config builds, from its inputs (for `edge doctor`)."""
    plan = check_inputs(cfg, model, engine=engine, calibrator=calibrator, show_progress=False)
    return is_current(plan.artifact, expected_model_info(plan), rebuild=plan.command)
