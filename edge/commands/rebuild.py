"""`edge rebuild`: recalibrate on today's scenes and hot-swap the running service's artifact, or change nothing.

    capture -> calibrate -> build -> gate -> latency -> install -> reload

1 capture    a fresh calibration set from the configured camera/source (every k-th frame, near-duplicates
             skipped) into a staging folder beside build.calibration_dir
2 calibrate  INT8 calibration + Q/DQ quantization on that set (edge.build.steps.step_quantize)
3 build      on the device with --engine: the TensorRT engine (edge.build.steps.step_engine); on a CPU the Q/DQ
             ONNX is the artifact
4 gate       the candidate against FP32 on the regression set (edge.build.steps.step_gate; enforced for trained weights)
5 latency    `edge check` with the candidate: p99 end_to_end within runtime.budget_ms
6 install    atomic install (edge.build.artifacts.install; the old one kept in <engines>/previous/), and the
             captured set replaces build.calibration_dir (the old set kept as <dir>.previous)
7 reload     SIGHUP to the service (--pid / --pidfile) or `systemctl reload <unit>` (--systemd)

Every input is checked before step 1. A step that fails stops the rebuild with one line naming it
("rebuild failed at step 'gate': ...") and a non-zero exit; nothing was installed, or (reload) the install is
rolled back, so the old artifact keeps serving. `--dry-run` prints the numbered plan and changes nothing.
See docs/rebuild.md.
"""

import argparse
import contextlib
import copy
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from edge.commands.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError

DEFAULT_UNIT = "jetson-edge"
RELOAD_SETTLE_S = 1.5  # after SIGHUP the service must still be running this long later
LOCK_NAME = ".rebuild.lock"


@dataclass
class Step:
    """One named step: `plan` says what it will do (concrete paths and commands), `run` does it."""

    name: str
    plan: str
    run: Callable[[], None]


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


class Rebuild:
    """The steps over one config; state flows from step to step through attributes."""

    def __init__(self, cfg: Any, reload: ReloadTarget, engine: bool = False, calibrator: bool = False,
                 frames: int = 3000, every: int = 15, max_images: int = 500, min_images: Optional[int] = None,
                 min_diff: float = 4.0, check_frames: int = 300, check_warmup: int = 20,
                 check_source: Optional[str] = None, keep_work: bool = False, command: str = "edge rebuild",
                 log: Callable[[str], None] = print):
        from edge.build.steps import artifact_path, source_model

        self.cfg = cfg
        self.reload = reload
        self.engine, self.calibrator = engine, calibrator
        self.frames, self.every, self.max_images = frames, every, max_images
        self.min_images = min_images if min_images is not None else cfg.build.min_images
        self.min_diff = min_diff
        self.check_frames, self.check_warmup = check_frames, check_warmup
        self.check_source = check_source or cfg.source.uri
        self.keep_work = keep_work
        self.command = command
        self.log = log
        b = cfg.build
        self.source = source_model(cfg.model.path)
        self.artifact = artifact_path(self.source, b.engines_dir, b.precision, engine)
        self.calibration_dir = os.path.abspath(b.calibration_dir)
        self.staged_set = "{}.rebuild-{}".format(self.calibration_dir, _utc_stamp())
        self.previous_set = self.calibration_dir + ".previous"
        self.latency_report = os.path.splitext(self.artifact)[0] + ".latency.json"
        self.work: Optional[str] = None
        self.plan: Any = None
        self.staged: List[str] = []
        self.candidate: Optional[str] = None
        self.quant: Optional[Dict[str, Any]] = None
        self.engine_info: Optional[Dict[str, Any]] = None
        self.gate: Any = None
        self.latency: Optional[Dict[str, Any]] = None
        self.installed = False
        self.set_promoted = False
        self.started = time.monotonic()

    # --- checks before any work ------------------------------------------------------------------------------

    def preflight(self) -> None:
        from edge.build.calibration import load_calibration_set
        from edge.build.steps import _check_source
        from edge.frame.sources import open_capture

        cfg, b = self.cfg, self.cfg.build
        where = cfg.path or "<defaults>"
        if b.precision != "int8":
            raise EdgeError("build.precision {} in {}: rebuilding the calibration only makes sense for int8".format(
                b.precision, where))
        for flag, value, low in (("--frames", self.frames, 1), ("--every", self.every, 1),
                                 ("--max-images", self.max_images, 1), ("--min-images", self.min_images, 1),
                                 ("--check-frames", self.check_frames, 1), ("--check-warmup", self.check_warmup, 0)):
            if value < low:
                raise EdgeError("{} must be >= {}, got {}".format(flag, low, value))
        if self.max_images < self.min_images:
            raise EdgeError("--max-images {} is below the {} images needed (--min-images / build.min_images)".format(
                self.max_images, self.min_images))
        if self.frames < self.every * self.min_images:
            raise EdgeError("--frames {} with --every {} cannot give {} images (--min-images / build.min_images)"
                            .format(self.frames, self.every, self.min_images))
        _check_source(self.source, cfg.preprocess.crop, where)
        load_calibration_set(b.regression_dir, 1, what="regression set (build.regression_dir in {})".format(where))
        for uri in (cfg.source.uri, self.check_source):
            source = copy.deepcopy(cfg.source)
            source.uri = uri
            open_capture(source)  # maps the URI, checks files exist; opens nothing
        for folder, what in ((b.engines_dir, "build.engines_dir"), (os.path.dirname(self.calibration_dir),
                                                                    "the folder of build.calibration_dir")):
            probe = os.path.abspath(folder)
            while not os.path.isdir(probe):
                probe = os.path.dirname(probe)
            if not os.access(probe, os.W_OK):
                raise EdgeError("{} {}: not writable".format(what, folder))
        if self.engine:
            from edge.build.tensorrt_engine import require_tensorrt

            require_tensorrt()
        if os.path.abspath(cfg.model.path) != os.path.abspath(self.artifact):
            self.log("rebuild: note: model.path is {} but the rebuild installs {}; the service keeps running "
                     "{} after reload (set model.path: {})".format(cfg.model.path, self.artifact, cfg.model.path,
                                                                   self.artifact))

    # --- the steps -------------------------------------------------------------------------------------------

    def steps(self) -> List[Step]:
        cfg, b = self.cfg, self.cfg.build
        conf = " --config " + shlex.quote(cfg.path) if cfg.path else ""
        gate = b.gate
        from edge.modelinfo import read_model_info

        trained = read_model_info(self.source).get("trained") is True if os.path.isfile(self.source) else False
        return [
            Step("capture", "read up to {} frames of {}, keep every {}th unless a near-duplicate (max {}, at least {})"
                 " -> {}/  (= edge calibrate capture {}{} --source {} --every {} --frames {} --max-images {})".format(
                     self.frames, cfg.source.uri, self.every, self.max_images, self.min_images, self.staged_set,
                     shlex.quote(self.staged_set), conf, shlex.quote(cfg.source.uri), self.every, self.frames,
                     self.max_images), self.step_capture),
            Step("calibrate", "{} INT8 calibration of {} on the captured set -> staged Q/DQ ONNX beside {}{}".format(
                b.method, self.source, self.artifact, "" if not self.calibrator else
                " (skipped: --calibrator calibrates inside TensorRT in step 3)"), self.step_calibrate),
            Step("build", "TensorRT {} engine -> staged beside {}".format(b.precision, self.artifact) if self.engine
                 else "no TensorRT build on this path: the Q/DQ ONNX is the artifact (--engine on the device)",
                 self.step_build),
            Step("gate", "candidate vs FP32 {} on {}: agreement >= {}, mean cosine >= {}, top-1 drop <= {} pp ({}) "
                 "-> {}".format(self.source, b.regression_dir, gate.min_agreement, gate.min_mean_cosine,
                                gate.max_top1_drop_pp, "enforced: trained weights" if trained else
                                "reported, not enforced: untrained weights", os.path.splitext(self.artifact)[0]
                                + ".gate.json"), self.step_gate),
            Step("latency", "edge check with the candidate: {} frames of {} after {} warm-up, p99 end_to_end <= {:g} ms"
                 " -> {}".format(self.check_frames, self.check_source, self.check_warmup, cfg.runtime.budget_ms,
                                 self.latency_report), self.step_latency),
            Step("install", "atomic install of {} (+ .json, .labels.txt), the current one kept in {}/; the captured "
                 "set replaces {}/ (current kept as {}/)".format(self.artifact, os.path.join(b.engines_dir, "previous"),
                                                                 self.calibration_dir, self.previous_set),
                 self.step_install),
            Step("reload", self.reload.describe() + ("" if self.reload.unit or self.reload.pid is None else
                                                     "; it must still be running {:g} s later".format(
                                                         RELOAD_SETTLE_S)), self.step_reload),
        ]

    def step_capture(self) -> None:
        from edge.build.calibration import capture_calibration_set
        from edge.frame.sources import open_capture

        source = copy.deepcopy(self.cfg.source)
        source.loop = False  # a file is read once
        capture = open_capture(source)

        def frames() -> Iterator[Any]:
            capture.open()
            try:
                for _ in range(self.frames):
                    image = capture.read()
                    if image is None:
                        return
                    yield image
            finally:
                capture.close()

        capture_calibration_set(frames(), self.staged_set, self.every, self.max_images, self.min_images,
                                self.min_diff, source=source.uri, log=self.log)

    def step_calibrate(self) -> None:
        from edge.build.artifacts import staging_path
        from edge.build.steps import check_inputs, step_quantize

        cfg = copy.deepcopy(self.cfg)
        cfg.build.calibration_dir = self.staged_set
        self.plan = check_inputs(cfg, None, self.engine, self.calibrator, show_progress=False)
        self.candidate = self.plan.source
        if self.calibrator:
            return
        self.staged.append(staging_path(os.path.splitext(self.artifact)[0] + ".qdq.onnx"))
        self.quant = step_quantize(self.plan, self.staged[-1], self.log)
        self.candidate = self.staged[-1]

    def step_build(self) -> None:
        if not self.engine:
            return
        from edge.build.artifacts import staging_path
        from edge.build.steps import step_engine

        assert self.candidate is not None
        self.staged.append(staging_path(self.artifact))
        self.engine_info = step_engine(self.plan, self.candidate, self.staged[-1], self.log)
        self.candidate = self.staged[-1]

    def step_gate(self) -> None:
        from edge.build.steps import step_gate

        assert self.candidate is not None
        self.gate = step_gate(self.plan, self.candidate, self.log)

    def step_latency(self) -> None:
        from edge.commands.check import run_check
        from edge.config import labels_path
        from edge.modelinfo import write_json_atomic

        assert self.candidate is not None
        self.work = tempfile.mkdtemp(prefix=".rebuild-", dir=os.path.dirname(os.path.abspath(self.artifact)))
        ext = os.path.splitext(self.artifact)[1]
        model = os.path.join(self.work, "candidate" + ext)  # the backend is chosen by the extension
        try:
            os.link(self.candidate, model)
        except OSError:
            shutil.copyfile(self.candidate, model)
        write_json_atomic(os.path.join(self.work, "candidate.json"), dict(self.plan.source_info))
        cfg = copy.deepcopy(self.cfg)
        cfg.model.path = model
        cfg.model.labels = labels_path(self.source, self.cfg.model.labels)
        cfg.source.uri = self.check_source
        cfg.runtime.warmup = self.check_warmup
        report = run_check(cfg, self.check_frames, self.latency_report, None, out=self.log, warn=self.log)
        self.latency = {k: report[k] for k in ("verdict", "verdict_reason", "budget_ms", "frames", "misses",
                                               "miss_rate")}
        self.latency.update(p50_ms=report["stages_ms"]["end_to_end"]["p50"],
                            p99_ms=report["stages_ms"]["end_to_end"]["p99"],
                            report=os.path.abspath(self.latency_report))
        if report["verdict"] != "pass":
            raise EdgeError("latency check failed: {} (report {})".format(report["verdict_reason"],
                                                                          self.latency_report), exit_code=EXIT_FAIL)

    def manifest(self) -> Dict[str, Any]:
        """The artifact manifest, as edge.build.steps.run_build writes it, plus the latency check."""
        from edge.build.steps import assemble_manifest

        assert self.candidate is not None and self.gate is not None
        manifest = assemble_manifest(self.plan, self.candidate, self.gate,
                                     {"command": self.command, "quantize": self.quant, "engine": self.engine_info,
                                      "seconds": round(time.monotonic() - self.started, 1)},
                                     calibration_dir=self.calibration_dir)
        manifest["latency"] = self.latency
        return manifest

    def step_install(self) -> None:
        from edge.build.steps import step_install

        assert self.candidate is not None
        step_install(self.plan, self.candidate, self.manifest(), self.log)
        self.installed = True
        if os.path.isdir(self.previous_set):
            shutil.rmtree(self.previous_set)
        if os.path.exists(self.calibration_dir):
            os.rename(self.calibration_dir, self.previous_set)
        os.rename(self.staged_set, self.calibration_dir)
        self.set_promoted = True
        self.log("install: calibration set {} now in {} (previous in {})".format(
            self.plan.calibration.sha256[:12], self.calibration_dir, self.previous_set))

    def step_reload(self) -> None:
        target = self.reload
        if target.unit:
            proc = subprocess.run(["systemctl", "reload", target.unit], capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                why = (proc.stderr or proc.stdout).strip().splitlines()
                raise EdgeError("systemctl reload {} exited {}: {}".format(target.unit, proc.returncode,
                                                                            why[0] if why else "no output"))
            self.log("reload: systemctl reload {} done".format(target.unit))
            return
        if target.pid is None:
            self.log("reload: skipped (--no-reload); restart or SIGHUP the service to use the new artifact")
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
        self.log("reload: sent SIGHUP to {}; it is still running".format(target.pid))

    # --- running ---------------------------------------------------------------------------------------------

    def undo_install(self) -> str:
        """Put the previous artifact and calibration set back; returns what was done, for the failure line."""
        from edge.build.artifacts import PREVIOUS, remove_quietly, rollback
        from edge.modelinfo import info_path

        done = []
        if self.installed:
            previous = os.path.join(os.path.dirname(os.path.abspath(self.artifact)), PREVIOUS,
                                    os.path.basename(self.artifact))
            if os.path.isfile(previous):
                rollback(self.artifact, self.log)
                done.append("previous artifact restored")
            else:  # there was none before: remove what was installed
                remove_quietly([self.artifact, info_path(self.artifact)])
                done.append("new artifact removed")
            self.installed = False
        if self.set_promoted:
            if os.path.isdir(self.previous_set):
                shutil.rmtree(self.calibration_dir)
                os.rename(self.previous_set, self.calibration_dir)
            self.set_promoted = False
            done.append("calibration set restored")
        return ", ".join(done)

    def cleanup(self, failed: bool) -> None:
        from edge.build.artifacts import remove_quietly

        remove_quietly(self.staged)
        self.staged = []
        if self.work and os.path.isdir(self.work):
            shutil.rmtree(self.work, ignore_errors=True)
        if failed and os.path.isdir(self.staged_set):
            if self.keep_work:
                self.log("rebuild: captured set kept for inspection: {}".format(self.staged_set))
            else:
                shutil.rmtree(self.staged_set, ignore_errors=True)

    def run(self) -> None:
        steps = self.steps()
        with _lock(self.cfg.build.engines_dir):
            failed = True
            try:
                for number, step in enumerate(steps, 1):
                    started = time.monotonic()
                    try:
                        step.run()
                    except Exception as exc:
                        self._fail(step, exc)
                    self.log("rebuild: step {}/{} '{}' done in {:.1f} s".format(number, len(steps), step.name,
                                                                                time.monotonic() - started))
                failed = False
            finally:
                self.cleanup(failed)
        self.log("rebuild: {} installed and {} in {:.0f} s".format(
            self.artifact, "reloaded" if self.reload.pid or self.reload.unit else "not reloaded",
            time.monotonic() - self.started))

    def _fail(self, step: Step, exc: BaseException) -> None:
        message = str(exc) if isinstance(exc, EdgeError) else "{}: {}".format(type(exc).__name__, exc)
        code = exc.exit_code if isinstance(exc, EdgeError) else EXIT_FAIL
        undone = ""
        try:
            undone = self.undo_install()
        except Exception as undo_exc:  # say so: the operator must look
            undone = "UNDO FAILED ({}: {}); check {} and {}".format(type(undo_exc).__name__, undo_exc, self.artifact,
                                                                   self.calibration_dir)
        state = undone or "nothing installed"
        raise EdgeError("rebuild failed at step '{}': {}; {}, {} unchanged".format(
            step.name, message, state, self.artifact) if not undone.startswith("UNDO") else
            "rebuild failed at step '{}': {}; {}".format(step.name, message, undone), exit_code=code) from None

    def format_plan(self) -> str:
        lines = ["edge rebuild: plan (dry run: nothing is captured, built, installed or signalled)"]
        for number, step in enumerate(self.steps(), 1):
            lines.append("  {}. {:<10} {}".format(number, step.name, step.plan))
        lines.append("any failing step: stop, exit non-zero with the step named; {} keeps serving".format(
            self.artifact if os.path.exists(self.artifact) else "the current artifact"))
        return "\n".join(lines)


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
    g.add_argument("--min-diff", type=float, default=4.0, help="near-duplicate threshold (default %(default)s)")
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
    cfg = config_from_args(args)
    reload = resolve_reload(args.pid, args.pidfile, args.systemd, args.unit, args.no_reload, args.force)
    rebuild = Rebuild(cfg, reload, args.engine, args.calibrator, args.frames, args.every, args.max_images,
                      args.min_images, args.min_diff, args.check_frames, args.check_warmup, args.check_source,
                      args.keep_work, " ".join(shlex.quote(a) for a in [os.path.basename(sys.argv[0])] + sys.argv[1:]),
                      log=lambda s: print(s, flush=True))
    rebuild.preflight()
    if args.dry_run:
        print(rebuild.format_plan(), flush=True)
        return EXIT_OK
    rebuild.run()
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge rebuild") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_rebuild, argv)


if __name__ == "__main__":
    sys.exit(main())
