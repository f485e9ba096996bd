"""The build chain: small named steps over one explicit state, run by one wrapper.

    edge build:    calibrate -> fallback -> [engine] -> gate -> install
    edge rebuild:  capture -> calibrate -> fallback -> build -> gate -> latency -> install -> reload
                   (edge.model.rebuild)

A step is `Step(name, run)`, `run(plan, state, log)` reading and filling the `BuildState`. `run_steps` times
each one and logs one line when it is done; a failure of any kind becomes one `StepFailed` line naming the
step, after the undo actions committed steps registered, and staged files are removed. From the first
`commit` step on, SIGINT/SIGTERM/SIGHUP are held back until the chain ends (edge.interrupts' "installing"
phase): an install is finished, never cut in half, and the log says the signal came.

The gate looks at the regression set once per build, at the model the calibration side chose (the float fallback
decides on held-out calibration images), and is enforced unless the model is declared untrained (--untrained, or
model info `trained: false`): random weights give ~1e-10 logits whose INT8 agreement means nothing
(cpu-baseline.md), so their gate is run and reported but not enforced, and the artifact stays marked untrained.
A model without model info is gated. An inconclusive verdict installs nothing unless --accept-inconclusive, which
the manifest and the log record.
"""

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from edge.board import current_system
from edge.errors import EXIT_FAIL, EdgeError, require
from edge.infer.qdq_emulation import int8_kernels_saturate
from edge.interrupts import Phase
from edge.model.auto_method import quantize
from edge.model.calibration import CalibrationSet, warn_if_few
from edge.model.fallback import RANKED_KEPT, expected_cost, search
from edge.model.fidelity import Fidelity, split
from edge.model.gate import GateResult, enforce, evaluate, kernel_distance, write_report
from edge.model.gate_looks import history_entry, history_path, next_look, record_history, record_look
from edge.model.gate_report import HISTORY_SHOWN, summary_path, write_summary
from edge.model.gate_stats import MAX_LOOKS, look_confidence
from edge.model.plan import BuildPlan, Log, fused_runner, onnx_runner
from edge.model.set_coverage import coverage
from edge.model.set_overlap import without_calibration
from edge.store.artifact import (
    install,
    labels_file,
    make_model_info,
    remove_quietly,
    rollback,
    sha256_file,
    staging_path,
    withdraw,
    writing,
)
from edge.store.model_info import UNTRAINED_WARNING, record_measured_top1

EXIT_INTERRUPTED = 130


@dataclass
class BuildState:
    """What the steps hand each other; `candidate` is the model the next step works on."""

    candidate: str
    calibration: Optional[CalibrationSet] = None
    staged: List[str] = field(default_factory=list)  # temporary files, removed at the end
    calibration_dir: Optional[str] = None  # where the set lives once installed, when a step moves it
    info: Dict[str, Any] = field(default_factory=dict)  # quantize / engine / latency summaries for the model info
    gate: Optional[GateResult] = None
    model_info: Dict[str, Any] = field(default_factory=dict)  # the installed artifact's, once installed
    undo: List[Tuple[str, Callable[[], None]]] = field(default_factory=list)  # (what it restores, how)
    started: float = field(default_factory=time.monotonic)

    def stage(self, dest: str) -> str:
        self.staged.append(staging_path(dest))
        return self.staged[-1]


StepFn = Callable[[BuildPlan, BuildState, Log], None]


@dataclass(frozen=True)
class Step:
    name: str
    run: StepFn
    commit: bool = False  # changes what is installed: Ctrl-C waits from here on


class StepFailed(EdgeError):
    """'<chain> failed at step '<name>': <why>; <what was undone or that nothing was installed>'."""


def _reason(exc: BaseException) -> Tuple[str, int]:
    if isinstance(exc, EdgeError):
        return str(exc), exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    if isinstance(exc, OSError):  # disk full, permissions
        return "{}{}".format(exc.strerror or exc, " ({})".format(exc.filename) if exc.filename else ""), EXIT_FAIL
    return "{}: {}".format(type(exc).__name__, exc), EXIT_FAIL


def _undo(state: BuildState, artifact: str) -> str:
    done = []
    while state.undo:
        what, action = state.undo.pop()
        try:
            action()
        except Exception as exc:  # say so: the operator must look
            return "UNDO FAILED: {} ({}: {}); check {}".format(what, type(exc).__name__, exc, artifact)
        done.append(what)
    return "{}, {} unchanged".format(", ".join(reversed(done)) or "nothing installed", artifact)


def run_steps(steps: Sequence[Step], plan: BuildPlan, state: BuildState, log: Log, chain: str = "build",
              cleanup: Callable[[bool], None] = lambda failed: None) -> None:
    """Run `steps` in order; `cleanup(failed)` and the removal of staged files run whatever happens."""
    installing = Phase("installing")  # from the first commit step on, signals wait for the end
    failed = True
    try:
        for number, step in enumerate(steps, 1):
            if step.commit:
                installing.begin()
            started = time.monotonic()
            try:
                step.run(plan, state, log)
            except (Exception, KeyboardInterrupt) as exc:
                why, code = _reason(exc)
                raise StepFailed("{} failed at step '{}': {}; {}".format(
                    chain, step.name, why, _undo(state, plan.artifact)), exit_code=code) from None
            log("{}: step {}/{} '{}' done in {:.1f} s".format(chain, number, len(steps), step.name,
                                                             time.monotonic() - started))
        failed = False
    finally:
        installing.begin()  # cleaning up is not cut short either
        try:
            remove_quietly(state.staged)
            cleanup(failed)
        finally:
            installing.end()
            if installing.held:
                names = "/".join(signal.Signals(s).name for s in sorted(set(installing.held)))
                log("{}: {} came during the undo and cleanup; held until they were done".format(chain, names) if failed
                    else "{}: {} came after the install had begun; it was completed".format(chain, names))


# --- the steps both chains share -----------------------------------------------------------------------------

def step_calibrate(plan: BuildPlan, state: BuildState, log: Log) -> None:
    """Calibrate on the CPU and write the validated Q/DQ model (edge.model.quantize raises on any TensorRT problem)."""
    if not plan.quantizes:
        return
    assert state.calibration is not None
    b = plan.cfg.build
    staged = state.stage(os.path.splitext(plan.artifact)[0] + ".qdq.onnx")
    state.info["quantize"] = quantize(plan.source, staged, state.calibration, plan.cfg.preprocess, b.method,
                                      b.exclude_sensitive, plan.show_progress, log, quantizer=b.quantizer,
                                      tensorrt=plan.target_tensorrt)
    state.candidate = staged


def step_engine(plan: BuildPlan, state: BuildState, log: Log) -> None:
    """The TensorRT engine from the candidate (Q/DQ, or FP32 with TensorRT's calibrator); verified before the gate."""
    if not plan.fmt.engine:
        return
    from edge.model.tensorrt_engine import build_engine, served_sizes

    b = plan.cfg.build
    staged = state.stage(plan.artifact)
    state.info["engine"] = build_engine(
        state.candidate, staged, precision=b.precision, workspace_mb=b.workspace_mb,
        images=state.calibration if plan.calibrator else None, preprocess=plan.cfg.preprocess,
        model_sha256=sha256_file(plan.source),
        cache_dir=os.path.join(os.path.dirname(os.path.abspath(b.calibration_dir)), "cache"), log=log,
        batch_sizes=served_sizes(plan.cfg.runtime.batching.max_batch))
    plan.fmt.verify(staged)
    state.candidate = staged


def judge(plan: BuildPlan, state: BuildState, runner: Callable[[str], Any], look: int) -> GateResult:
    """FP32 ONNX Runtime vs the candidate (run by `runner`) on the regression set less the calibration images, at
    look `look`'s confidence (edge.model.gate_looks)."""
    regression, overlap, near = without_calibration(plan.regression, state.calibration)
    with onnx_runner(plan.source) as reference, runner(state.candidate) as infer:
        result = evaluate(reference, infer, regression, plan.cfg.preprocess, plan.cfg.build.gate, plan.labels,
                          confidence=look_confidence(look), source_info=plan.source_info,
                          candidate_name=plan.cfg.build.precision.upper())
    cover = coverage(state.calibration, regression)
    result.report.update(look=look, calibration_overlap_dropped=overlap, calibration_near_duplicates=near,
                         calibration_coverage=cover, warnings=[cover["warning"]] if "warning" in cover else [])
    return result


def step_fallback(plan: BuildPlan, state: BuildState, log: Log) -> None:
    """On held-out calibration images, never the regression set: when the Q/DQ model misses the gate's cosine
    thresholds there, the layers whose quantisation hurts most stay in float (edge.model.fallback) until it meets
    them or build.max_float_layers are float. The gate then looks at the regression set once."""
    limit = plan.cfg.build.max_float_layers
    if not plan.quantizes or not plan.gate_enforced or limit == 0:
        return
    assert state.calibration is not None
    onnx, thresholds, summary = require("onnx"), plan.cfg.build.gate, state.info["quantize"]
    fidelity = Fidelity(plan.source, split(state.calibration)[1], plan.cfg.preprocess)
    plain = summary["held_out"] = fidelity.verdict(onnx.load(state.candidate), thresholds)
    if plain["passed"]:
        return
    log("fallback: with every quantised layer in INT8, {} held-out calibration images miss the gate's cosine "
        "thresholds (mean {:.4f}, p5 {:.4f}); looking for the layers that break it".format(
            plain["images"], plain["mean_cosine"], plain["p5_cosine"]))
    path, chosen, verdict, ranked = search(fidelity, state.candidate, thresholds, limit, state.stage, log)
    summary["float_layers_ranked"] = ranked[:RANKED_KEPT]  # the per-layer damage, kept whatever was chosen
    if path is None:
        log("fallback: still short with {} layers in float; the gate judges the INT8 model".format(len(chosen)))
        summary["float_layers_tried"] = {"layers": chosen, "held_out": verdict}
        return
    names = [r["node"] for r in chosen]
    summary["float_layers"] = [dict(r, why="held-out calibration images missed the gate's cosine thresholds in "
                                          "INT8; leaving this layer in float recovers this much of 1 - logit cosine")
                               for r in chosen]
    summary["float_layers_cost"] = expected_cost(plan.source, names)
    summary["held_out"] = verdict
    summary["excluded_nodes"] = sorted(set(summary["excluded_nodes"]) | set(names))
    state.candidate = path


def step_gate(plan: BuildPlan, state: BuildState, log: Log) -> None:
    """FP32 ONNX Runtime vs the candidate on the regression set, once; the report is written whatever the verdict."""
    result = judge(plan, state, plan.fmt.runner, next_look(plan.looks_path) if plan.looks_path else 1)
    look = {"candidate": os.path.basename(plan.artifact) + " ({} candidate)".format(
                "float fallback" if "float_layers" in (state.info.get("quantize") or {}) else plan.fmt.name),
            "verdict": result.report["verdict"], "claims": result.report["claims"],
            "accept_inconclusive": plan.accept_inconclusive}
    result.report["looks"] = record_look(plan.looks_path, look) if plan.looks_path else [look]
    if plan.looks_path:  # a gated model's builds, one history per source
        result.report["history"] = record_history(history_path(plan.cfg.build.engines_dir, sha256_file(plan.source)),
                                                  history_entry(result.report, look["candidate"]))[-HISTORY_SHOWN:]
    extra = {k: v for k, v in (state.info.get("quantize") or {}).items() if k.startswith("float_layers")}
    if not plan.fmt.engine:
        with onnx_runner(state.candidate) as judged, fused_runner(state.candidate) as fused:
            extra["this_cpu_int8_kernels"] = dict(kernel_distance(judged, fused, plan.regression, plan.cfg.preprocess),
                                                  saturate=int8_kernels_saturate(), served="emulated")
    extra.update(artifact=plan.artifact, source=plan.source, enforced=plan.gate_enforced,
                 evaluator=plan.fmt.evaluator, accept_inconclusive=plan.accept_inconclusive)
    write_report(plan.report_path, result, extra)
    write_summary(summary_path(plan.report_path), dict(result.report, **extra))
    log("gate: {} - {} (report {})".format(result.verdict, result.summary(), plan.report_path))
    looks = result.report["looks"]
    if len(looks) > 1:
        log("gate: look {} of this model at this regression set (earlier: {}), judged at {:.2f} % so that all its "
            "looks keep 95 %; after {} a fresh set is required".format(
                len(looks), ", ".join("{} {}".format(x["at"], x["verdict"]) for x in looks[:-1]),
                100.0 * result.report["confidence"], MAX_LOOKS))
    state.gate = result
    if plan.gate_enforced:
        _record_reference(plan, result.report, log)
        enforce(result, plan.report_path, plan.accept_inconclusive)
        if result.report["verdict"] == "inconclusive":
            log("gate: INCONCLUSIVE, installed because --accept-inconclusive was given: {}".format(
                "; ".join(result.report["inconclusive"])))
    elif result.report["verdict"] != "pass":
        log("gate: not enforced - {} ({})".format(UNTRAINED_WARNING, plan.source_info.get("weights", "unknown")))


def _record_reference(plan: BuildPlan, r: Dict[str, Any], log: Log) -> None:
    """A model whose model info records no expected top-1: FP32's, measured here and judged sound, recorded for the
    later builds (edge.store.model_info.record_measured_top1)."""
    if "expected_top1" in plan.source_info or not r.get("reference_top1") or any(r.get(k) for k in (
            "reference_failure", "labels_failure", "swapped_folders", "reference_near_uniform")):
        return
    figure = "FP32 top-1 {:.1f} % on {} labelled images".format(100.0 * r["reference_top1"], r["labelled"])
    try:
        path = record_measured_top1(plan.source, r["reference_top1"], set_sha256=r["regression_sha256"],
                                    images=r["labelled"])
    except (OSError, EdgeError) as exc:
        path, why = None, " (not recorded: {})".format(getattr(exc, "strerror", None) or exc)
    else:
        why = ""
    log("gate: {} recorded in {}: later builds are held to it".format(figure, path) if path else
        "gate: {}{}; hold later builds to it with: edge model add {} --expected-top1 {:.4f}".format(
            figure, why, plan.source, r["reference_top1"]))


def assemble_model_info(plan: BuildPlan, state: BuildState) -> Dict[str, Any]:
    """The model info for the candidate as it will be installed at `plan.artifact`."""
    b, result = plan.cfg.build, state.gate
    assert result is not None
    calibration = None
    if state.calibration is not None:
        here = os.path.dirname(os.path.abspath(plan.artifact))  # recorded paths: relative to the artifact's folder
        calibration = {"set": os.path.relpath(os.path.abspath(state.calibration_dir or state.calibration.root), here),
                       "sha256": state.calibration.sha256, "images": len(state.calibration),
                       "method": plan.calibration_method,
                       "exclude_sensitive": None if plan.calibrator else b.exclude_sensitive}
    gate = {k: result.report.get(k) for k in ("passed", "verdict", "claims", "agreement", "mean_cosine", "p5_cosine",
                                              "min_cosine", "samples", "labelled", "top1_drop_pp",
                                              "top1_drop_interval_pp", "regression_sha256", "reference_top1",
                                              "candidate_top1", "confidence", "calibration_overlap_dropped",
                                              "calibration_near_duplicates")}
    gate.update({"enforced": plan.gate_enforced, "report": os.path.basename(plan.report_path),
                 "accepted_inconclusive": plan.accept_inconclusive and result.report["verdict"] == "inconclusive",
                 "looks": len(result.report.get("looks", [])),
                 "flips": len(result.report["flips"]) + result.report["flips_not_listed"]})
    build = {"command": plan.command, "quantize": state.info.get("quantize"), "engine": state.info.get("engine"),
             "seconds": round(time.monotonic() - state.started, 1)}
    info = make_model_info(state.candidate, plan.source_info, plan.source, fmt=plan.fmt.name, precision=b.precision,
                           calibration=calibration, gate=gate, system=current_system(), build=build)
    if plan.fmt.engine:  # an engine has no graph to read at load: whether it ends in Softmax is recorded
        from edge.infer.onnxruntime_backend import ends_in_softmax

        info["output"] = dict(info.get("output") or {}, softmax=ends_in_softmax(
            require("onnx").load(plan.source, load_external_data=False).graph))
    if "latency" in state.info:
        info["latency"] = state.info["latency"]
    return info


def step_install(plan: BuildPlan, state: BuildState, log: Log) -> None:
    """Atomic install (the current set kept as previous); registers its undo for the steps after it."""
    labels = labels_file(plan.source)
    had_previous = os.path.exists(plan.artifact)
    state.model_info = install(plan.artifact, artifact=state.candidate, info=assemble_model_info(plan, state),
                               labels=labels if os.path.isfile(labels) else None, verify_staged=plan.fmt.verify,
                               log=log)
    if had_previous:
        state.undo.append(("previous artifact restored",
                           lambda: rollback(plan.artifact, verify_kept=plan.fmt.verify, log=log)))
    else:
        state.undo.append(("new artifact removed", lambda: withdraw(plan.artifact)))


CALIBRATE = Step("calibrate", step_calibrate)
FALLBACK = Step("fallback", step_fallback)
ENGINE = Step("engine", step_engine)
GATE = Step("gate", step_gate)
INSTALL = Step("install", step_install, commit=True)


def run_build(plan: BuildPlan, log: Log = print) -> Dict[str, Any]:
    """calibrate + quantize -> [engine] -> gate -> install, holding the engines folder's lock throughout;
    returns the installed artifact's model info."""
    if plan.calibration is not None:
        warn_if_few(len(plan.calibration), log)
    steps = [CALIBRATE, FALLBACK] if plan.quantizes else []
    steps += ([ENGINE] if plan.fmt.engine else []) + [GATE, INSTALL]
    state = BuildState(candidate=plan.source, calibration=plan.calibration)
    with writing(os.path.dirname(os.path.abspath(plan.artifact)), "edge build"):
        run_steps(steps, plan, state, log)
    return state.model_info
