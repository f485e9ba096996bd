"""The rebuild's own steps: capture a calibration set, check latency, install the set (edge.cli.rebuild
adds the lock, the reload and the command line).

    capture -> calibrate -> fallback -> build -> gate -> latency -> install -> reload

calibrate, build and gate are `edge build`'s steps (edge.model.steps) on the same BuildPlan and BuildState.
The latency step measures the candidate in this process through `edge check`'s run (edge.bench.check.run_check:
the Runtime and frame loop `edge run` uses, with the service's config and its overrides; edge.bench.check.verdict
reads the report's keys). Install is edge build's,
then the captured set replaces build.calibration_dir in one step (edge.store.versions.replace_folder, the one
versioned-folder switch) and the old set is kept as `<dir>.previous`; a `.previous` folder is only ever
replaced when it is a set this tool wrote (its manifest lists every file in it): a user's file there stops the
rebuild before any work. What a killed rebuild left is settled by the next one (`recover_sets`): the set the
installed artifact's model info records goes to build.calibration_dir, a leftover becomes `.previous`.
"""

import os
import shlex
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from edge.bench.check import CheckOptions, run_check, verdict
from edge.config import Config, with_overrides
from edge.errors import EXIT_FAIL, EdgeError
from edge.fields import check_options
from edge.model.auto_method import AUTO, CANDIDATES
from edge.model.calibration import MANIFEST, capture_calibration_set, frames_of, load_calibration_set
from edge.model.plan import BuildPlan, Log, check_inputs
from edge.model.rebuild_options import RebuildOptions
from edge.model.steps import CALIBRATE, ENGINE, FALLBACK, GATE, BuildState, Step, step_install
from edge.sources.source import open_capture
from edge.store.artifact import install, labels_file, lookup, served_note
from edge.store.fileio import check_output, check_replaceable, temp_dir
from edge.store.model_info import read_model_info
from edge.store.versions import discard, move, recover_folder, replace_folder
from edge.uri import redact


@dataclass(frozen=True)
class RebuildJob:
    """What the rebuild-only steps need besides the BuildPlan: the service's config, the options, where things go."""

    cfg: Config
    options: RebuildOptions = field(default_factory=RebuildOptions)
    keep_work: bool = False
    stamp: str = ""
    accept_inconclusive: bool = False  # --accept-inconclusive: the gate's inconclusive verdict still installs

    @property
    def min_images(self) -> int:
        return self.cfg.build.min_images

    @property
    def check_source(self) -> str:
        return self.options.check_source or self.cfg.source.uri

    @property
    def calibration_dir(self) -> str:
        return os.path.abspath(self.cfg.build.calibration_dir)

    @property
    def staged_set(self) -> str:
        return "{}.rebuild-{}".format(self.calibration_dir, self.stamp)

    @property
    def previous_set(self) -> str:
        return self.calibration_dir + ".previous"


def latency_report(plan: BuildPlan) -> str:
    return os.path.splitext(plan.artifact)[0] + ".latency.json"


def _check_numbers(job: RebuildJob) -> None:
    o = job.options
    check_options(o)
    if o.max_images < job.min_images:
        raise EdgeError("--max-images {} is below the {} images needed (--min-images / build.min_images)".format(
            o.max_images, job.min_images))
    if o.capture_frames < o.every * job.min_images:
        raise EdgeError("--capture-frames {} with --every {} cannot give {} images (--min-images / build.min_images)"
                        .format(o.capture_frames, o.every, job.min_images))


def preflight(job: RebuildJob, *, engine: bool, calibrator: bool, log: Log) -> BuildPlan:
    """Every input and output checked before any work; the BuildPlan the shared steps run on."""
    cfg, b = job.cfg, job.cfg.build
    if b.precision != "int8":
        raise EdgeError("build.precision {} in {}: rebuilding the calibration only makes sense for int8".format(
            b.precision, cfg.path or "<defaults>"))
    _check_numbers(job)
    plan = check_inputs(with_overrides(cfg, {"build.calibration_dir": job.staged_set}), None, engine=engine,
                        calibrator=calibrator, show_progress=False, load_calibration=False,
                        accept_inconclusive=job.accept_inconclusive)
    for uri in (cfg.source.uri, job.check_source):
        open_capture(with_overrides(cfg, {"source.uri": uri}).source)  # maps the URI, checks files exist; opens nothing
    check_output(os.path.join(job.staged_set, MANIFEST), "captured calibration set")
    check_output(latency_report(plan), "latency report")
    check_replaceable(job.previous_set, MANIFEST)  # the old .previous is removed by the install
    note = served_note(cfg.model.path, plan.artifact)
    if note:
        log("rebuild: " + note)
    return plan


def step_capture(job: RebuildJob, plan: BuildPlan, state: BuildState, log: Log) -> None:
    o, source = job.options, with_overrides(job.cfg, {"source.loop": False}).source  # a file is read once
    state.calibration = capture_calibration_set(frames_of(open_capture(source), o.capture_frames), job.staged_set,
                                                o.every, o.max_images, job.min_images, o.min_diff,
                                                source=source.uri, log=log)
    state.calibration_dir = job.calibration_dir  # where the manifest will find it once installed


def step_latency(job: RebuildJob, plan: BuildPlan, state: BuildState, log: Log) -> None:
    """p99 end_to_end of the candidate within runtime.budget_ms, measured in this process as `edge check` measures
    (run_check) on a set of its own in a work folder (the backend is chosen by the extension). No process of its
    own is needed: the check's stages make their CUDA session and release it at close (edge.infer.stages), as the
    gate's runner did before them."""
    report = latency_report(plan)
    with temp_dir(os.path.dirname(os.path.abspath(plan.artifact)), ".rebuild-") as work:
        model = os.path.join(work, "candidate" + plan.fmt.suffix)  # a set of its own, as edge build installs one
        labels = labels_file(plan.source)
        install(model, artifact=state.candidate, info=plan.source_info,
                labels=labels if os.path.isfile(labels) else None, keep_previous=False, log=lambda *a: None)
        cfg = with_overrides(job.cfg, {"model.path": model, "source.uri": job.check_source})
        options = CheckOptions(frames=job.options.check_frames, warmup=job.options.check_warmup, json=report,
                               plot="")
        result = verdict(run_check(cfg, options, out=lambda table: None, warn=log), report)
    state.info["latency"] = dict(result.summary, report=os.path.basename(report))  # the report: beside the artifact
    if not result.passed:
        raise EdgeError("latency check failed: {} (report {})".format(result.reason, report), exit_code=EXIT_FAIL)


def step_install_set(job: RebuildJob, plan: BuildPlan, state: BuildState, log: Log) -> None:
    """edge build's install, then the captured set replaces build.calibration_dir in one step, the old one kept as
    `.previous` (edge.store.versions.replace_folder; undone on a failed reload)."""
    step_install(plan, state, log)
    check_replaceable(job.previous_set, MANIFEST)  # still only a set this tool wrote
    discard(job.previous_set, job.calibration_dir)
    had_set = os.path.lexists(job.calibration_dir)
    replace_folder(job.staged_set, job.calibration_dir, previous=job.previous_set)

    def restore_set() -> None:  # the set this rebuild captured goes back to its name: removed by its cleanup
        if had_set:
            replace_folder(job.previous_set, job.calibration_dir, previous=job.staged_set)
        else:
            move(job.calibration_dir, job.staged_set)

    state.undo.append(("calibration set restored", restore_set))
    assert state.calibration is not None
    log("install: calibration set {} now in {} (previous in {})".format(
        state.calibration.sha256[:12], job.calibration_dir, job.previous_set))


def recover_sets(job: RebuildJob, plan: BuildPlan, log: Log) -> None:
    """What a killed rebuild left beside build.calibration_dir, settled by the installed artifact: an old set left
    aside goes back (edge.store.versions.recover_folder), the set the artifact's model info records goes to
    build.calibration_dir (from a `<dir>.rebuild-*` or `.previous`), and a leftover becomes `.previous` when there
    is none, else it is removed."""
    dest, kept = job.calibration_dir, job.previous_set
    for line in recover_folder(dest, previous=kept):
        log("rebuild: " + line)
    parent, name = os.path.split(dest)
    recorded = lookup(read_model_info(plan.artifact), "calibration.sha256") if os.path.exists(plan.artifact) else None
    left = [os.path.join(parent, n) for n in sorted(os.listdir(parent)) if n.startswith(name + ".rebuild-")
            and os.path.join(parent, n) != job.staged_set]

    def sha(path: str) -> Optional[str]:
        try:
            return load_calibration_set(path, verify=False).sha256
        except EdgeError:
            return None

    match = next((p for p in left + [kept] if os.path.isdir(p) and sha(p) == recorded), None)
    if match is not None and (not os.path.exists(dest) or sha(dest) != recorded):
        if match != kept and os.path.lexists(dest):
            discard(kept, dest)  # an older set: the one `dest` holds now becomes the previous
        replace_folder(match, dest, previous=kept)
        log("rebuild: {} holds the set {} records again (a rebuild was killed mid-install)".format(
            dest, plan.artifact))
    for path in (p for p in left if os.path.isdir(p)):
        if not os.path.exists(kept) and os.path.isfile(os.path.join(path, MANIFEST)):
            move(path, kept)
            log("rebuild: {} (left by a killed rebuild) kept as {}".format(path, kept))
        else:
            discard(path, dest)
            log("rebuild: {} (left by a killed rebuild) removed".format(path))


def rebuild_steps(job: RebuildJob, reload: Step) -> List[Step]:
    def own(fn: Any) -> Any:
        return lambda plan, state, log: fn(job, plan, state, log)

    return [Step("capture", own(step_capture)), CALIBRATE, FALLBACK, Step("build", ENGINE.run), GATE,
            Step("latency", own(step_latency)), Step("install", own(step_install_set), commit=True), reload]


def describe(job: RebuildJob, plan: BuildPlan, reload: str) -> List[Tuple[str, str]]:
    """(step, what it will do with the concrete paths and commands) for the dry run."""
    cfg, b, gate, o = job.cfg, job.cfg.build, job.cfg.build.gate, job.options
    conf = " --config " + shlex.quote(cfg.path) if cfg.path else ""
    uri = redact(cfg.source.uri)
    return [
        ("capture", "read up to {} frames of {}, keep every {}th unless a near-duplicate (max {}, at least {}) -> {}/"
         "  (= edge calibrate capture {}{} --source {} --every {} --capture-frames {} --max-images {})".format(
             o.capture_frames, uri, o.every, o.max_images, job.min_images, job.staged_set,
             shlex.quote(job.staged_set), conf, shlex.quote(uri), o.every, o.capture_frames, o.max_images)),
        ("calibrate", "{} INT8 calibration of {} on the captured set -> staged Q/DQ ONNX beside {}{}".format(
            "{} (auto: the closest to FP32 kept)".format(", ".join(CANDIDATES[b.quantizer])) if b.method == AUTO
            else b.method,
            plan.source, plan.artifact,
            "" if plan.quantizes else " (skipped: --calibrator calibrates inside TensorRT in step 3)")),
        ("fallback", "the Q/DQ model judged in the Q/DQ graph's FP32 semantics on held-out captured images; if it "
         "misses the gate's cosine thresholds there, up to {} of the layers INT8 hurts most stay in float".format(
             b.max_float_layers)
         if plan.quantizes else "skipped: no Q/DQ model on this path"),
        ("build", "TensorRT {} engine -> staged beside {}".format(b.precision, plan.artifact) if plan.fmt.engine
         else "no TensorRT build on this path: the Q/DQ ONNX is the artifact (--engine on the device)"),
        ("gate", "candidate vs FP32 {} on {}, once: mean cosine >= {}, top-1 drop's 95 % upper bound <= {} pp "
         "(labelled images), agreement >= {} (unlabelled images) ({}{}) -> {}".format(
             plan.source, b.regression_dir, gate.min_mean_cosine, gate.max_top1_drop_pp, gate.min_agreement,
             "enforced" if plan.gate_enforced else "reported, not enforced: declared untrained",
             "; inconclusive installs (--accept-inconclusive)" if plan.accept_inconclusive else
             "; inconclusive installs nothing", plan.report_path)),
        ("latency", "edge check's run, in this process, with the candidate: {} frames of {} after {} warm-up, "
         "p99 end_to_end <= {:g} ms -> {}".format(o.check_frames, redact(job.check_source), o.check_warmup,
                                                  cfg.runtime.budget_ms, latency_report(plan))),
        ("install", "atomic install of {} (+ .json, .labels.txt), the current one kept in {}/; the captured set "
         "replaces {}/ (current kept as {}/)".format(plan.artifact, os.path.join(b.engines_dir, "previous"),
                                                     job.calibration_dir, job.previous_set)),
        ("reload", reload),
    ]


def format_plan(job: RebuildJob, plan: BuildPlan, reload: str) -> str:
    lines = ["edge rebuild: plan (dry run: nothing is captured, built, installed or signalled)"]
    lines += ["  {}. {:<10} {}".format(n, name, text) for n, (name, text) in enumerate(describe(job, plan, reload), 1)]
    lines.append("any failing step: stop, exit non-zero with the step named; {} keeps serving".format(
        plan.artifact if os.path.exists(plan.artifact) else "the current artifact"))
    return "\n".join(lines)
