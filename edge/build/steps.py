"""`edge build`, `edge calibrate`, `edge rollback`: an INT8 artifact as a chain of small named steps.

    load config -> check inputs -> calibrate + quantize -> validate Q/DQ -> [TensorRT engine] -> gate -> install

CPU (default): installs `<engines>/<model>.int8.onnx`, the TensorRT-compatible Q/DQ model, judged in ONNX
Runtime. `--engine` (on the device): builds `<model>.<precision>.engine` from that Q/DQ model (or, with
`--calibrator`, from the FP32 model with TensorRT's entropy calibrator) and judges the engine itself.
Every input is checked before any work starts; a failure anywhere leaves the installed artifact untouched.

The gate is enforced when the source model is trained (its model info says so). Untrained (random)
weights give ~1e-10 logits whose INT8 agreement means nothing (cpu-baseline.md): the gate is then run and
reported but not enforced, and the artifact stays marked untrained.
"""

import argparse
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from edge.build.artifacts import (
    artifact_is_current,
    current_system,
    install,
    make_manifest,
    remove_quietly,
    rollback,
    staging_path,
    system_expectations,
    verify_onnx,
)
from edge.build.calibration import (
    DEFAULT_MIN_DIFF,
    CalibrationSet,
    capture_calibration_set,
    import_calibration_set,
    load_calibration_set,
    warn_if_few,
)
from edge.config import Config, load_config
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError, require
from edge.build.gate import GateResult, enforce, evaluate, resolve_labels, write_report
from edge.modelinfo import UNTRAINED_WARNING, read_model_info
from edge.build.quantize import OPSET_MAX, OPSET_MIN, quantize_qdq

_PRECISION_SUFFIX = re.compile(r"\.(int8|fp16|fp32)$")


def source_model(model_path: str) -> str:
    """The FP32 ONNX behind a configured model path: engines/m.int8.engine -> engines/m.onnx."""
    return _PRECISION_SUFFIX.sub("", os.path.splitext(model_path)[0]) + ".onnx"


def artifact_path(source: str, engines_dir: str, precision: str, engine: bool) -> str:
    stem = os.path.splitext(os.path.basename(source))[0]
    return os.path.join(engines_dir, "{}.{}.{}".format(stem, precision, "engine" if engine else "onnx"))


@dataclass
class BuildPlan:
    """Everything a build needs, checked up front by `check_inputs`."""

    cfg: Config
    source: str
    artifact: str
    engine: bool
    calibrator: bool  # TensorRT implicit calibration instead of the Q/DQ model
    source_info: Dict[str, Any]
    labels: Optional[List[str]]
    calibration: Optional[CalibrationSet]
    regression: CalibrationSet
    rebuild: str
    show_progress: bool = True

    @property
    def fmt(self) -> str:
        return "tensorrt-engine" if self.engine else "onnx-qdq"

    @property
    def report_path(self) -> str:
        return os.path.splitext(self.artifact)[0] + ".gate.json"

    @property
    def gate_enforced(self) -> bool:
        return self.source_info.get("trained") is True


def rebuild_command(cfg: Config, model: Optional[str] = None, engine: bool = False, calibrator: bool = False) -> str:
    parts = ["edge build"]
    if cfg.path:
        parts.append("--config " + cfg.path)
    if model:
        parts.append("--model " + model)
    if engine:
        parts.append("--engine")
    if calibrator:
        parts.append("--calibrator")
    return " ".join(parts)


def _check_source(source: str, crop: int, where: str) -> None:
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
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgeError("{}: not a valid ONNX model: {}".format(source, first)) from None
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        raise EdgeError("{}: already quantized; point --model at the FP32 export".format(source))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not OPSET_MIN <= opset <= OPSET_MAX:
        raise EdgeError("{}: opset {}, INT8 Q/DQ needs {}-{} (re-export with: edge export)".format(
            source, opset, OPSET_MIN, OPSET_MAX))
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    dims = [d.dim_value for d in inputs[0].type.tensor_type.shape.dim] if len(inputs) == 1 else []
    if dims != [1, 3, crop, crop]:
        raise EdgeError("{}: input shape {} does not match preprocess.crop {} in {} (expected [1, 3, {}, {}])".format(
            source, dims or "(not one input)", crop, where, crop, crop))


def check_inputs(cfg: Config, model: Optional[str] = None, engine: bool = False, calibrator: bool = False,
                 show_progress: bool = True) -> BuildPlan:
    """Validate every input before any work; each problem is one line naming the file or config field."""
    from edge.frame.postprocess import load_labels

    b = cfg.build
    where = cfg.path or "<defaults>"
    source = model or source_model(cfg.model.path)
    if not engine and b.precision != "int8":
        raise EdgeError("build.precision {} in {}: the CPU build makes INT8 Q/DQ models only; fp16/fp32 engines "
                        "need --engine on the device".format(b.precision, where))
    if calibrator and not (engine and b.precision == "int8"):
        raise EdgeError("--calibrator: TensorRT calibration applies to INT8 engines only "
                        "(--engine, build.precision int8)")
    _check_source(source, cfg.preprocess.crop, where)
    calibration = None
    if b.precision == "int8":
        calibration = load_calibration_set(b.calibration_dir, b.min_images,
                                           what="calibration set (build.calibration_dir in {})".format(where))
    regression = load_calibration_set(b.regression_dir, 1,
                                      what="regression set (build.regression_dir in {})".format(where))
    labels_file = os.path.splitext(source)[0] + ".labels.txt"
    labels = load_labels(labels_file) if os.path.isfile(labels_file) else None
    resolve_labels(regression, labels)
    try:
        os.makedirs(b.engines_dir, exist_ok=True)
    except OSError as exc:
        raise EdgeError("build.engines_dir {}: cannot create it ({})".format(b.engines_dir, exc.strerror)) from None
    if not os.access(b.engines_dir, os.W_OK):
        raise EdgeError("build.engines_dir {}: not writable".format(b.engines_dir))
    if engine:
        from edge.build.tensorrt_engine import require_tensorrt

        require_tensorrt()
        require("pycuda.driver")
    return BuildPlan(cfg=cfg, source=source, artifact=artifact_path(source, b.engines_dir, b.precision, engine),
                     engine=engine, calibrator=calibrator, source_info=read_model_info(source), labels=labels,
                     calibration=calibration, regression=regression,
                     rebuild=rebuild_command(cfg, model, engine, calibrator), show_progress=show_progress)


def expected_manifest(plan: BuildPlan, system: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """What an installed artifact must record to count as built from this plan's inputs on this system."""
    from edge.modelinfo import sha256_file

    b = plan.cfg.build
    expected: Dict[str, Any] = {"source.sha256": sha256_file(plan.source), "precision": b.precision,
                                "format": plan.fmt}
    if plan.calibration is not None:
        expected["calibration.sha256"] = plan.calibration.sha256
        expected["calibration.method"] = "tensorrt-entropy2" if plan.calibrator else b.method
        expected["calibration.exclude_sensitive"] = None if plan.calibrator else b.exclude_sensitive
    expected.update(system_expectations(plan.fmt, system))
    return expected


def artifact_status(cfg: Config, model: Optional[str] = None, engine: bool = False,
                    calibrator: bool = False) -> Tuple[bool, str]:
    """(current?, reason) for the artifact this config builds: the runtime's hook for `build.auto_rebuild`."""
    plan = check_inputs(cfg, model, engine, calibrator, show_progress=False)
    return artifact_is_current(plan.artifact, expected_manifest(plan), plan.rebuild)


# --- steps ---------------------------------------------------------------------------------------------------

def _timed(log: Callable[..., None], name: str, fn: Callable[[], Any]) -> Any:
    started = time.monotonic()
    result = fn()
    log("build: {} done in {:.1f} s".format(name, time.monotonic() - started))
    return result


def step_quantize(plan: BuildPlan, staged: str, log: Callable[..., None]) -> Dict[str, Any]:
    """Calibrate on the CPU and write the validated Q/DQ model (edge.build.quantize raises on any TensorRT problem)."""
    b = plan.cfg.build
    assert plan.calibration is not None
    return quantize_qdq(plan.source, staged, plan.calibration, plan.cfg.preprocess, b.method, b.exclude_sensitive,
                        plan.show_progress, log)


def step_engine(plan: BuildPlan, onnx_path: str, staged: str, log: Callable[..., None]) -> Dict[str, Any]:
    from edge.build.tensorrt_engine import build_engine, verify_engine
    from edge.modelinfo import sha256_file

    b = plan.cfg.build
    info = build_engine(onnx_path, staged, b.precision, b.workspace_mb, plan.calibration if plan.calibrator else None,
                        plan.cfg.preprocess, sha256_file(plan.source),
                        os.path.join(os.path.dirname(os.path.abspath(b.calibration_dir)), "cache"), log)
    verify_engine(staged)
    return info


@dataclass
class _Runner:
    """An infer(tensor) -> logits callable with a lifecycle, over ONNX Runtime or a TensorRT engine."""

    path: str
    engine: bool = False

    def __enter__(self) -> Callable[[Any], Any]:
        if self.engine:
            from edge.build.tensorrt_engine import EngineRunner

            self._ctx: Any = EngineRunner(self.path)
            return self._ctx.__enter__()
        from edge.frame.onnxruntime_backend import OnnxRuntimeBackend

        self._ctx = OnnxRuntimeBackend(self.path)
        return self._ctx.__enter__().infer

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)


def step_gate(plan: BuildPlan, candidate: str, log: Callable[..., None]) -> GateResult:
    """FP32 ONNX Runtime vs the candidate on the regression set; the report is written pass or fail."""
    with _Runner(plan.source) as reference, _Runner(candidate, plan.engine) as infer:
        result = evaluate(reference, infer, plan.regression, plan.cfg.preprocess, plan.cfg.build.gate, plan.labels)
    write_report(plan.report_path, result, {"artifact": plan.artifact, "source": plan.source,
                                            "enforced": plan.gate_enforced})
    verdict = "passed" if result.passed else "FAILED"
    log("gate: {} - {} (report {})".format(verdict, result.summary(), plan.report_path))
    if plan.gate_enforced:
        enforce(result, plan.report_path)
    elif not result.passed:
        log("gate: not enforced - {} ({})".format(UNTRAINED_WARNING, plan.source_info.get("weights", "unknown")))
    return result


def assemble_manifest(plan: BuildPlan, candidate: str, result: GateResult, build: Dict[str, Any],
                      calibration_dir: Optional[str] = None) -> Dict[str, Any]:
    """The manifest for `candidate` (the staged artifact) as it will be installed at `plan.artifact`.

    `calibration_dir`: where the calibration set will live if it moves after the build (edge rebuild).
    """
    b = plan.cfg.build
    calibration = None
    if plan.calibration is not None:
        calibration = {"set": os.path.abspath(calibration_dir or plan.calibration.root),
                       "sha256": plan.calibration.sha256, "images": len(plan.calibration),
                       "method": "tensorrt-entropy2" if plan.calibrator else b.method,
                       "exclude_sensitive": None if plan.calibrator else b.exclude_sensitive}
    gate = {k: result.report.get(k) for k in ("passed", "agreement", "mean_cosine", "min_cosine", "samples",
                                              "labelled", "top1_drop_pp", "regression_sha256")}
    gate.update({"enforced": plan.gate_enforced, "report": os.path.abspath(plan.report_path),
                 "flips": len(result.report["flips"]) + result.report["flips_not_listed"]})
    manifest = make_manifest(candidate, plan.source_info, plan.source, plan.fmt, b.precision, calibration, gate,
                             current_system(), build)
    manifest["artifact"] = os.path.basename(plan.artifact)
    return manifest


def step_install(plan: BuildPlan, staged: str, manifest: Dict[str, Any], log: Callable[..., None]) -> str:
    staged_labels = None
    labels_src = os.path.splitext(plan.source)[0] + ".labels.txt"
    if os.path.isfile(labels_src):
        staged_labels = staging_path(os.path.splitext(plan.artifact)[0] + ".labels.txt")
        shutil.copyfile(labels_src, staged_labels)
        os.chmod(staged_labels, 0o644)
    if plan.engine:
        from edge.build.tensorrt_engine import verify_engine

        verify: Callable[[str], None] = verify_engine
    else:
        verify = verify_onnx
    try:
        return install(staged, plan.artifact, manifest, staged_labels, verify, log)
    finally:
        remove_quietly([staged_labels])


def run_build(plan: BuildPlan, log: Callable[..., None] = print) -> Dict[str, Any]:
    """calibrate + quantize -> [engine] -> gate -> install; returns the installed artifact's manifest."""
    b = plan.cfg.build
    staged: List[str] = []
    started = time.monotonic()
    try:
        candidate = plan.source
        quant: Optional[Dict[str, Any]] = None
        if plan.calibration is not None:
            warn_if_few(len(plan.calibration), log)
        if b.precision == "int8" and not plan.calibrator:
            staged.append(staging_path(os.path.splitext(plan.artifact)[0] + ".qdq.onnx"))
            quant = _timed(log, "calibrate + quantize + validate Q/DQ",
                           lambda: step_quantize(plan, staged[-1], log))
            candidate = staged[-1]
        engine_info = None
        if plan.engine:
            staged.append(staging_path(plan.artifact))
            engine_info = _timed(log, "engine", lambda: step_engine(plan, candidate, staged[-1], log))
            candidate = staged[-1]
        result = _timed(log, "gate", lambda: step_gate(plan, candidate, log))
        manifest = assemble_manifest(plan, candidate, result, {"command": plan.rebuild, "quantize": quant,
                                                               "engine": engine_info,
                                                               "seconds": round(time.monotonic() - started, 1)})
        step_install(plan, candidate, manifest, log)
        return manifest
    except OSError as exc:  # disk full, permissions: one line, nothing installed
        raise EdgeError("build: {}{}; nothing installed ({} unchanged)".format(
            exc.strerror or exc, " ({})".format(exc.filename) if exc.filename else "", plan.artifact),
            exit_code=EXIT_FAIL) from None
    finally:
        remove_quietly(staged)
