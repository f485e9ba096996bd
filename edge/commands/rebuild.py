"""`edge rebuild`: recalibrate on today's scenes and hot-swap the running service's artifact, or change nothing.

    capture -> calibrate -> build -> gate -> latency -> install -> reload

1 capture    a fresh calibration set from the configured camera/source (every k-th frame, near-duplicates
             skipped) into a staging folder beside build.calibration_dir
2 calibrate  INT8 calibration + Q/DQ quantization on that set      } the steps `edge build` runs
3 build      on the device with --engine: the TensorRT engine;      } (edge.build.steps), on the
             on a CPU the Q/DQ ONNX is the artifact                 } same BuildPlan and BuildState
4 gate       the candidate against FP32 on the regression set (enforced for trained weights)
5 latency    `edge check` with the candidate: p99 end_to_end within runtime.budget_ms
6 install    atomic install (the old one kept in <engines>/previous/), and the captured set replaces
             build.calibration_dir (the old set kept as <dir>.previous)
7 reload     SIGHUP to the service (--pid / --pidfile) or `systemctl reload <unit>` (--systemd)

Every input is checked before step 1. The steps run through edge.build.steps.run_steps: a step that fails
stops the rebuild with one line naming it ("rebuild failed at step 'gate': ...") and a non-zero exit; nothing
was installed, or (reload) the install is undone, so the old artifact keeps serving. From the install on,
Ctrl-C waits for the end. `--dry-run` prints the numbered plan and changes nothing. See docs/rebuild.md.
"""

import argparse
import contextlib
import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence, Tuple

from edge.commands.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.config import Config, with_overrides
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError

if TYPE_CHECKING:
    from edge.build.plan import BuildPlan
    from edge.build.steps import BuildState, Step

DEFAULT_UNIT = "jetson-edge"
RELOAD_SETTLE_S = 1.5  # after SIGHUP the service must still be running this long later
LOCK_NAME = ".rebuild.lock"


@dataclass
class ReloadTarget:
    pid: Optional[int] = None
    pidfile: Optional[str] = None
    unit: Optional[str] = None  # systemd unit

    def describe(self) -> str:
        if self.unit:
            return "systemctl reload " + self.unit
        if self.pid is not None:
            return "kill -HUP {}{}".format(self.pid, " (from {})".format(self.pidfile) if self.pidfile else "")
        return "no reload (--no-reload)"


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _cmdline(pid: int) -> Optional[str]:
    try:
        with open("/proc/{}/cmdline".format(pid), "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return None


def process_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an exited child not yet reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/{}/stat".format(pid), "r", encoding="utf-8", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def resolve_reload(pid: Optional[int], pidfile: Optional[str], systemd: bool, unit: str, no_reload: bool,
                   force: bool = False) -> ReloadTarget:
    """Check the reload target before any work: one of --pid/--pidfile/--systemd/--no-reload, and it must exist."""
    chosen = [n for n, v in (("--pid", pid is not None), ("--pidfile", pidfile), ("--systemd", systemd),
                             ("--no-reload", no_reload)) if v]
    if len(chosen) != 1:
        raise EdgeError("say how to reach the running service: exactly one of --pid PID, --pidfile PATH, --systemd "
                        "or --no-reload (got {})".format(", ".join(chosen) or "none"))
    if no_reload:
        return ReloadTarget()
    if systemd:
        if shutil.which("systemctl") is None:
            raise EdgeError("--systemd: systemctl not found on PATH")
        proc = subprocess.run(["systemctl", "is-active", "--quiet", unit], capture_output=True, text=True)
        if proc.returncode != 0:
            raise EdgeError("--systemd: unit {} is not active (systemctl is-active {}); start it or use --no-reload"
                            .format(unit, unit))
        return ReloadTarget(unit=unit)
    if pidfile:
        try:
            with open(pidfile, "r", encoding="utf-8") as fh:
                text = fh.read().strip()
        except OSError as exc:
            raise EdgeError("{}: cannot read pidfile: {}".format(pidfile, exc.strerror)) from None
        if not text.isdigit():
            raise EdgeError("{}: pidfile must hold a process id, got {!r}".format(pidfile, text[:40]))
        pid = int(text)
    assert pid is not None
    if pid <= 1:
        raise EdgeError("--pid must be a service's process id (> 1), got {}".format(pid))
    if not process_alive(pid):
        raise EdgeError("no running process {}{}".format(pid, " (from {}: stale?)".format(pidfile) if pidfile else ""))
    cmdline = _cmdline(pid)
    if cmdline is not None and "edge" not in cmdline and not force:
        raise EdgeError("process {} is not jetson-edge ({!r}); refusing to signal it (--force to insist)".format(
            pid, cmdline[:80]))
    return ReloadTarget(pid=pid, pidfile=pidfile)


@contextlib.contextmanager
def _lock(folder: str) -> Iterator[None]:
    """One rebuild at a time per engines folder."""
    import fcntl

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_NAME)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise EdgeError("{}: another rebuild is running (lock held)".format(path)) from None
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@dataclass(frozen=True)
class RebuildJob:
    """What the rebuild-only steps need besides the BuildPlan: the capture and check settings, and where things go."""

    cfg: Config
    reload: ReloadTarget
    frames: int = 3000
    every: int = 15
    max_images: int = 500
    min_images: int = 32
    min_diff: float = 4.0
    check_frames: int = 300
    check_warmup: int = 20
    check_source: str = "synthetic"
    keep_work: bool = False
    stamp: str = ""

    @property
    def calibration_dir(self) -> str:
        return os.path.abspath(self.cfg.build.calibration_dir)

    @property
    def staged_set(self) -> str:
        return "{}.rebuild-{}".format(self.calibration_dir, self.stamp)

    @property
    def previous_set(self) -> str:
        return self.calibration_dir + ".previous"


def latency_report(plan: "BuildPlan") -> str:
    return os.path.splitext(plan.artifact)[0] + ".latency.json"


def preflight(job: RebuildJob, engine: bool, calibrator: bool, log: Any) -> "BuildPlan":
    """Every input checked before any work; the BuildPlan the shared steps run on (its set comes from capture)."""
    from edge.build.plan import check_inputs
    from edge.frame.sources import open_capture

    cfg, b = job.cfg, job.cfg.build
    if b.precision != "int8":
        raise EdgeError("build.precision {} in {}: rebuilding the calibration only makes sense for int8".format(
            b.precision, cfg.path or "<defaults>"))
    for flag, value, low in (("--frames", job.frames, 1), ("--every", job.every, 1),
                             ("--max-images", job.max_images, 1), ("--min-images", job.min_images, 1),
                             ("--check-frames", job.check_frames, 1), ("--check-warmup", job.check_warmup, 0)):
        if value < low:
            raise EdgeError("{} must be >= {}, got {}".format(flag, low, value))
    if job.max_images < job.min_images:
        raise EdgeError("--max-images {} is below the {} images needed (--min-images / build.min_images)".format(
            job.max_images, job.min_images))
    if job.frames < job.every * job.min_images:
        raise EdgeError("--frames {} with --every {} cannot give {} images (--min-images / build.min_images)"
                        .format(job.frames, job.every, job.min_images))
    plan = check_inputs(with_overrides(cfg, {"build.calibration_dir": job.staged_set}), None, engine, calibrator,
                        show_progress=False, load_calibration=False)
    for uri in (cfg.source.uri, job.check_source):
        open_capture(with_overrides(cfg, {"source.uri": uri}).source)  # maps the URI, checks files exist; opens nothing
    probe = os.path.dirname(job.calibration_dir)
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK):
        raise EdgeError("the folder of build.calibration_dir {}: not writable".format(b.calibration_dir))
    if os.path.abspath(cfg.model.path) != os.path.abspath(plan.artifact):
        log("rebuild: note: model.path is {} but the rebuild installs {}; the service keeps running {} after reload "
            "(set model.path: {})".format(cfg.model.path, plan.artifact, cfg.model.path, plan.artifact))
    return plan


# --- the rebuild's own steps (calibrate, build, gate and install are edge build's) ---------------------------

def step_capture(job: RebuildJob, plan: "BuildPlan", state: "BuildState", log: Any) -> None:
    from edge.build.calibration import capture_calibration_set
    from edge.commands.build import frames_of
    from edge.frame.sources import open_capture

    source = with_overrides(job.cfg, {"source.loop": False}).source  # a file is read once
    state.calibration = capture_calibration_set(frames_of(open_capture(source), job.frames), job.staged_set,
                                                job.every, job.max_images, job.min_images, job.min_diff,
                                                source=source.uri, log=log)
    state.calibration_dir = job.calibration_dir  # where the manifest will find it once installed


def step_latency(job: RebuildJob, plan: "BuildPlan", state: "BuildState", log: Any) -> None:
    """`edge check` on a link to the candidate (the backend is chosen by the extension) in a work folder."""
    from edge.commands.check import run_check
    from edge.config import labels_path
    from edge.modelinfo import write_json_atomic

    work = tempfile.mkdtemp(prefix=".rebuild-", dir=os.path.dirname(os.path.abspath(plan.artifact)))
    try:
        model = os.path.join(work, "candidate" + plan.fmt.suffix)
        try:
            os.link(state.candidate, model)
        except OSError:
            shutil.copyfile(state.candidate, model)
        write_json_atomic(os.path.join(work, "candidate.json"), dict(plan.source_info))
        cfg = with_overrides(job.cfg, {"model.path": model, "source.uri": job.check_source,
                                       "model.labels": labels_path(plan.source, job.cfg.model.labels),
                                       "runtime.warmup": job.check_warmup})
        report = run_check(cfg, job.check_frames, latency_report(plan), None, out=log, warn=log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    latency = {k: report[k] for k in ("verdict", "verdict_reason", "budget_ms", "frames", "misses", "miss_rate")}
    latency.update(p50_ms=report["stages_ms"]["end_to_end"]["p50"], p99_ms=report["stages_ms"]["end_to_end"]["p99"],
                   report=os.path.abspath(latency_report(plan)))
    state.info["latency"] = latency
    if report["verdict"] != "pass":
        raise EdgeError("latency check failed: {} (report {})".format(report["verdict_reason"], latency_report(plan)),
                        exit_code=EXIT_FAIL)


def step_install(job: RebuildJob, plan: "BuildPlan", state: "BuildState", log: Any) -> None:
    """edge build's install, then the captured set replaces build.calibration_dir (undone on a failed reload)."""
    from edge.build.steps import step_install as install_artifact

    install_artifact(plan, state, log)
    if os.path.isdir(job.previous_set):
        shutil.rmtree(job.previous_set)
    had_set = os.path.exists(job.calibration_dir)
    if had_set:
        os.rename(job.calibration_dir, job.previous_set)
    os.rename(job.staged_set, job.calibration_dir)

    def restore_set() -> None:
        shutil.rmtree(job.calibration_dir)
        if had_set:
            os.rename(job.previous_set, job.calibration_dir)

    state.undo.append(("calibration set restored", restore_set))
    assert state.calibration is not None
    log("install: calibration set {} now in {} (previous in {})".format(
        state.calibration.sha256[:12], job.calibration_dir, job.previous_set))


def step_reload(job: RebuildJob, plan: "BuildPlan", state: "BuildState", log: Any) -> None:
    target = job.reload
    if target.unit:
        proc = subprocess.run(["systemctl", "reload", target.unit], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            raise EdgeError("systemctl reload {} exited {}: {}".format(target.unit, proc.returncode,
                                                                        why[0] if why else "no output"))
        log("reload: systemctl reload {} done".format(target.unit))
        return
    if target.pid is None:
        log("reload: skipped (--no-reload); restart or SIGHUP the service to use the new artifact")
        return
    try:
        os.kill(target.pid, signal.SIGHUP)
    except OSError as exc:
        raise EdgeError("cannot signal process {}: {}".format(target.pid, exc.strerror)) from None
    deadline = time.monotonic() + RELOAD_SETTLE_S
    while time.monotonic() < deadline:
        if not process_alive(target.pid):
            raise EdgeError("process {} exited on SIGHUP instead of reloading (does it run edge run with "
                            "reload support?)".format(target.pid))
        time.sleep(0.05)
    log("reload: sent SIGHUP to {}; it is still running".format(target.pid))


def rebuild_steps(job: RebuildJob) -> List["Step"]:
    from edge.build.steps import CALIBRATE, ENGINE, GATE, Step

    own = functools.partial
    return [Step("capture", own(step_capture, job)), CALIBRATE, Step("build", ENGINE.run), GATE,
            Step("latency", own(step_latency, job)), Step("install", own(step_install, job), commit=True),
            Step("reload", own(step_reload, job), commit=True)]


def describe(job: RebuildJob, plan: "BuildPlan") -> List[Tuple[str, str]]:
    """(step, what it will do with the concrete paths and commands) for the dry run."""
    cfg, b, gate = job.cfg, job.cfg.build, job.cfg.build.gate
    conf = " --config " + shlex.quote(cfg.path) if cfg.path else ""
    settle = "" if job.reload.unit or job.reload.pid is None else "; it must still be running {:g} s later".format(
        RELOAD_SETTLE_S)
    return [
        ("capture", "read up to {} frames of {}, keep every {}th unless a near-duplicate (max {}, at least {}) -> {}/"
         "  (= edge calibrate capture {}{} --source {} --every {} --frames {} --max-images {})".format(
             job.frames, cfg.source.uri, job.every, job.max_images, job.min_images, job.staged_set,
             shlex.quote(job.staged_set), conf, shlex.quote(cfg.source.uri), job.every, job.frames, job.max_images)),
        ("calibrate", "{} INT8 calibration of {} on the captured set -> staged Q/DQ ONNX beside {}{}".format(
            b.method, plan.source, plan.artifact,
            "" if plan.quantizes else " (skipped: --calibrator calibrates inside TensorRT in step 3)")),
        ("build", "TensorRT {} engine -> staged beside {}".format(b.precision, plan.artifact) if plan.fmt.engine
         else "no TensorRT build on this path: the Q/DQ ONNX is the artifact (--engine on the device)"),
        ("gate", "candidate vs FP32 {} on {}: agreement >= {}, mean cosine >= {}, top-1 drop <= {} pp ({}) -> {}"
         .format(plan.source, b.regression_dir, gate.min_agreement, gate.min_mean_cosine, gate.max_top1_drop_pp,
            "enforced: trained weights" if plan.gate_enforced else "reported, not enforced: untrained weights",
            plan.report_path)),
        ("latency", "edge check with the candidate: {} frames of {} after {} warm-up, p99 end_to_end <= {:g} ms -> {}"
         .format(job.check_frames, job.check_source, job.check_warmup, cfg.runtime.budget_ms, latency_report(plan))),
        ("install", "atomic install of {} (+ .json, .labels.txt), the current one kept in {}/; the captured set "
         "replaces {}/ (current kept as {}/)".format(plan.artifact, os.path.join(b.engines_dir, "previous"),
                                                     job.calibration_dir, job.previous_set)),
        ("reload", job.reload.describe() + settle),
    ]


def format_plan(job: RebuildJob, plan: "BuildPlan") -> str:
    lines = ["edge rebuild: plan (dry run: nothing is captured, built, installed or signalled)"]
    lines += ["  {}. {:<10} {}".format(n, name, text) for n, (name, text) in enumerate(describe(job, plan), 1)]
    lines.append("any failing step: stop, exit non-zero with the step named; {} keeps serving".format(
        plan.artifact if os.path.exists(plan.artifact) else "the current artifact"))
    return "\n".join(lines)


def run_rebuild(job: RebuildJob, plan: "BuildPlan", log: Any) -> None:
    from edge.build.steps import BuildState, run_steps

    def cleanup(failed: bool) -> None:
        if failed and os.path.isdir(job.staged_set):
            if job.keep_work:
                log("rebuild: captured set kept for inspection: {}".format(job.staged_set))
            else:
                shutil.rmtree(job.staged_set, ignore_errors=True)

    state = BuildState(candidate=plan.source)
    with _lock(plan.cfg.build.engines_dir):
        run_steps(rebuild_steps(job), plan, state, log, chain="rebuild", cleanup=cleanup)
    log("rebuild: {} installed and {} in {:.0f} s".format(
        plan.artifact, "reloaded" if job.reload.pid or job.reload.unit else "not reloaded",
        time.monotonic() - state.started))


# --- command line --------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)
    p.add_argument("--engine", action="store_true", help="build a TensorRT engine (on the device)")
    p.add_argument("--calibrator", action="store_true", help="with --engine: TensorRT's own entropy calibrator")
    g = p.add_argument_group("capture")
    g.add_argument("--frames", type=int, default=3000, help="frames to read from the source (default %(default)s)")
    g.add_argument("--every", type=int, default=15, help="keep every k-th frame (default %(default)s)")
    g.add_argument("--max-images", type=int, default=500, help="stop after this many images (default %(default)s)")
    g.add_argument("--min-images", type=int, help="fewer is a failure (default build.min_images)")
    g.add_argument("--min-diff", type=float, help="near-duplicate threshold (default 4)")
    g = p.add_argument_group("latency check")
    g.add_argument("--check-frames", type=int, default=300, help="timed frames (default %(default)s)")
    g.add_argument("--check-warmup", type=int, default=20, help="warm-up frames (default %(default)s)")
    g.add_argument("--check-source", help="source for the check (default: the configured source; use synthetic "
                                          "when the service holds the camera)")
    g = p.add_argument_group("reload (exactly one)")
    g.add_argument("--pid", type=int, help="SIGHUP this edge run process")
    g.add_argument("--pidfile", help="SIGHUP the process whose id this file holds")
    g.add_argument("--systemd", action="store_true", help="systemctl reload the unit (--unit)")
    g.add_argument("--unit", default=DEFAULT_UNIT, help="systemd unit (default %(default)s)")
    g.add_argument("--no-reload", action="store_true", help="install only; the service picks it up on restart")
    g.add_argument("--force", action="store_true", help="signal --pid even if it does not look like edge")
    p.add_argument("--dry-run", action="store_true", help="print the numbered plan and change nothing")
    p.add_argument("--keep-work", action="store_true", help="on failure keep the captured set for inspection")


def register(subparsers: Any) -> None:
    add_command(subparsers, "rebuild", "capture -> calibrate -> build -> gate -> latency -> install -> reload",
            __doc__, add_arguments, cmd_rebuild)


def cmd_rebuild(args: argparse.Namespace) -> int:
    from edge.build.calibration import DEFAULT_MIN_DIFF

    cfg = config_from_args(args)
    reload = resolve_reload(args.pid, args.pidfile, args.systemd, args.unit, args.no_reload, args.force)
    job = RebuildJob(cfg, reload, args.frames, args.every, args.max_images,
                     cfg.build.min_images if args.min_images is None else args.min_images,
                     DEFAULT_MIN_DIFF if args.min_diff is None else args.min_diff, args.check_frames,
                     args.check_warmup, args.check_source or cfg.source.uri, args.keep_work, _utc_stamp())
    log = functools.partial(print, flush=True)
    plan = preflight(job, args.engine, args.calibrator, log)
    if args.dry_run:
        print(format_plan(job, plan), flush=True)
        return EXIT_OK
    run_rebuild(job, plan, log)
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge rebuild") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_rebuild, argv)


if __name__ == "__main__":
    sys.exit(main())
