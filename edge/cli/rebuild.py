"""`edge rebuild`: recalibrate on today's scenes and hot-swap the running service's artifact, or change nothing.

    capture -> calibrate -> fallback -> build -> gate -> latency -> install -> reload

1 capture    a fresh calibration set from the configured camera/source (every k-th frame, near-duplicates
             skipped) into a staging folder beside build.calibration_dir
2 calibrate  INT8 calibration + Q/DQ quantization on that set      } the steps `edge build` runs
3 build      on the device with --engine: the TensorRT engine;      } (edge.model.steps), on the
             on a CPU the Q/DQ ONNX is the artifact                 } same BuildPlan and BuildState
4 gate       the candidate against FP32 on the regression set (enforced for trained weights)
5 latency    `edge check` with the candidate: p99 end_to_end within runtime.budget_ms
6 install    atomic install (the old one kept in <engines>/previous/), and the captured set replaces
             build.calibration_dir (the old set kept as <dir>.previous)
7 reload     SIGHUP to the service (--pid / --pidfile: only an `edge run` process) or `systemctl reload <unit>`
             (--systemd); done when the service's metrics (service.metrics) count the reload and name the
             installed sha256. A reload it reports as failed, or none within the timeout, undoes the install.

Every input is checked before step 1. The steps (edge.model.rebuild) run through edge.model.steps.run_steps: a
step that fails stops the rebuild with one line naming it ("rebuild failed at step 'gate': ...") and a non-zero
exit; nothing was installed, or (reload) the install is undone, so the old artifact keeps serving. From the
install on, Ctrl-C waits for the end. `--dry-run` prints the numbered plan and changes nothing. See
docs/rebuild.md.
"""

import argparse
import functools
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from edge.cli.build import BuildOptions
from edge.cli.common import add_command, add_config_flags, config_from_args
from edge.config import Config
from edge.errors import EXIT_OK, EdgeError, first_line, require
from edge.fields import add_flags, options_from, setting
from edge.model.rebuild_options import RebuildOptions
from edge.uri import metrics_url as metrics_endpoint

if TYPE_CHECKING:
    from edge.model.plan import BuildPlan
    from edge.model.rebuild import RebuildJob
    from edge.model.steps import BuildState

DEFAULT_UNIT = "jetson-edge"
RELOAD_TIMEOUT_S = 180.0  # loading a TensorRT engine on a small board takes tens of seconds


@dataclass(frozen=True)
class ReloadOptions:
    """How `edge rebuild` reaches the running service (exactly one of pid, pidfile, systemd, no_reload), and its
    own switches; declared once (edge.fields)."""

    pid: int = setting(0, "SIGHUP this edge run process (0: none)", flag="--pid")
    pidfile: str = setting("", "SIGHUP the edge run process whose id this file holds", flag="--pidfile")
    systemd: bool = setting(False, "systemctl reload the unit (--unit)", flag="--systemd")
    unit: str = setting(DEFAULT_UNIT, "systemd unit", flag="--unit")
    no_reload: bool = setting(False, "install only; the service picks it up on restart", flag="--no-reload")
    dry_run: bool = setting(False, "print the numbered plan and change nothing", flag="--dry-run")
    keep_work: bool = setting(False, "on failure keep the captured set for inspection", flag="--keep-work")


@dataclass
class ReloadTarget:
    pid: Optional[int] = None
    pidfile: Optional[str] = None
    unit: Optional[str] = None  # systemd unit
    metrics: str = ""  # the service's /metrics URL, which confirms the reload

    def describe(self) -> str:
        if self.unit:
            how = "systemctl reload " + self.unit
        elif self.pid is not None:
            how = "kill -HUP {}{}".format(self.pid, " (from {})".format(self.pidfile) if self.pidfile else "")
        else:
            return "no reload (--no-reload)"
        return "{}; done when {} counts the reload and names the installed sha256".format(how, self.metrics)


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _argv(pid: int) -> Optional[List[str]]:
    try:
        with open("/proc/{}/cmdline".format(pid), "rb") as fh:
            return [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return None


def is_edge_run(argv: List[str]) -> bool:
    """`edge run ...`, `python [-opts] -m edge run ...` or `python [-opts] .../edge run ...`."""
    rest = list(argv)
    if rest and os.path.basename(rest[0]).startswith("python"):
        rest = rest[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest = rest[1:]
        if rest[:2] == ["-m", "edge"]:
            rest = rest[1:]
    return len(rest) >= 2 and os.path.basename(rest[0]) == "edge" and rest[1] == "run"


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


def metrics_url(cfg: Config) -> str:
    """Where the service's metrics are, from its config; a rebuild that reloads needs them to confirm it."""
    m = cfg.service.metrics
    if not m.enabled:
        raise EdgeError("service.metrics.enabled is false in {}: the rebuild confirms a reload from the service's "
                        "metrics; enable them or use --no-reload".format(cfg.path or "<defaults>"))
    return metrics_endpoint(m.host, m.port, local_client=True)


def _pid_target(pid: Optional[int], pidfile: Optional[str]) -> int:
    if pidfile:
        try:
            with open(pidfile, "r", encoding="utf-8") as fh:
                text = fh.read(64).strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise EdgeError("{}: cannot read pidfile: {}".format(pidfile, first_line(exc))) from None
        if not (text.isascii() and text.isdigit()):
            raise EdgeError("{}: pidfile must hold a process id, got {!r}".format(pidfile, text[:40]))
        pid = int(text)
    assert pid is not None
    if pid <= 1:
        raise EdgeError("--pid must be a service's process id (> 1), got {}".format(pid))
    if not process_alive(pid):
        raise EdgeError("no running process {}{}".format(pid, " (from {}: stale?)".format(pidfile) if pidfile else ""))
    argv = _argv(pid)
    if argv is None or not is_edge_run(argv):
        shown = " ".join(argv or ["(command line unreadable)"])[:80]
        raise EdgeError("process {} is not an `edge run` service ({!r}); refusing to signal it".format(pid, shown))
    return pid


def resolve_reload(cfg: Config, opts: ReloadOptions) -> ReloadTarget:
    """Check the reload target before any work: one of --pid/--pidfile/--systemd/--no-reload, and it must exist."""
    pid, pidfile, systemd, unit, no_reload = opts.pid or None, opts.pidfile, opts.systemd, opts.unit, opts.no_reload
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
        proc = subprocess.run(["systemctl", "is-active", "--quiet", unit], capture_output=True,
                              encoding="utf-8", errors="replace")
        if proc.returncode != 0:
            raise EdgeError("--systemd: unit {} is not active (systemctl is-active {}); start it or use --no-reload"
                            .format(unit, unit))
        return ReloadTarget(unit=unit, metrics=metrics_url(cfg))
    return ReloadTarget(pid=_pid_target(pid, pidfile), pidfile=pidfile or None, metrics=metrics_url(cfg))


def service_state(url: str) -> Dict[str, Any]:
    """{'ok': n, 'failed': n, 'sha256': serving} from the service's edge_reloads_total and edge_engine_info."""
    parser = require("prometheus_client.parser")
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read(4 << 20).decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        raise EdgeError("{}: the service's metrics are unreachable ({})".format(url, first_line(exc))) from None
    state: Dict[str, Any] = {"ok": 0.0, "failed": 0.0, "sha256": None}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "edge_reloads_total" and sample.labels.get("result") in ("ok", "failed"):
                state[sample.labels["result"]] = sample.value
            elif sample.name == "edge_engine_info":
                state["sha256"] = sample.labels.get("sha256")
    return state


def _signal(target: ReloadTarget) -> None:
    if target.unit:
        proc = subprocess.run(["systemctl", "reload", target.unit], capture_output=True,
                              encoding="utf-8", errors="replace", timeout=60)
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            raise EdgeError("systemctl reload {} exited {}: {}".format(target.unit, proc.returncode,
                                                                        why[0] if why else "no output"))
        return
    assert target.pid is not None
    if not is_edge_run(_argv(target.pid) or []):  # the id may have been reused since the rebuild began
        raise EdgeError("process {} is no longer an `edge run` service; not signalled".format(target.pid))
    try:
        os.kill(target.pid, signal.SIGHUP)
    except OSError as exc:
        raise EdgeError("cannot signal process {}: {}".format(target.pid, exc.strerror)) from None


def step_reload(target: ReloadTarget, plan: "BuildPlan", state: "BuildState", log: Any) -> None:
    """Signal the service, then wait until its metrics count the reload and name the installed sha256."""
    if target.pid is None and target.unit is None:
        log("reload: skipped (--no-reload); restart or SIGHUP the service to use the new artifact")
        return
    before = service_state(target.metrics)
    _signal(target)
    deadline = time.monotonic() + RELOAD_TIMEOUT_S
    while True:
        if target.pid is not None and not process_alive(target.pid):
            raise EdgeError("process {} exited on SIGHUP instead of reloading".format(target.pid))
        now = service_state(target.metrics)
        if now["failed"] > before["failed"]:
            raise EdgeError("the service reported its reload failed and keeps serving the old model (its log has "
                            "the 'reload_failed' line)")
        if now["ok"] > before["ok"]:
            break
        if time.monotonic() > deadline:
            raise EdgeError("the service did not confirm a reload within {:.0f} s".format(RELOAD_TIMEOUT_S))
        time.sleep(0.2)
    if now["sha256"] != state.model_info["sha256"]:
        raise EdgeError("the service reloaded but serves sha256 {}, not the installed {} (is its model.path {}?)"
                        .format(str(now["sha256"])[:12], state.model_info["sha256"][:12], plan.artifact))
    log("reload: {} confirmed: the service serves {} (sha256 {})".format(
        target.describe().split(";")[0], plan.artifact, state.model_info["sha256"][:12]))


def run_rebuild(job: "RebuildJob", plan: "BuildPlan", target: ReloadTarget, log: Any) -> None:
    from edge.model.rebuild import rebuild_steps, recover_sets
    from edge.model.steps import BuildState, Step, run_steps
    from edge.store.artifact import writing

    def cleanup(failed: bool) -> None:
        if failed and os.path.isdir(job.staged_set):
            if job.keep_work:
                log("rebuild: captured set kept for inspection: {}".format(job.staged_set))
            else:
                shutil.rmtree(job.staged_set, ignore_errors=True)

    state = BuildState(candidate=plan.source)
    reload = Step("reload", functools.partial(step_reload, target), commit=True)
    with writing(os.path.dirname(os.path.abspath(plan.artifact)), "edge rebuild"):  # the engines folder's one lock
        recover_sets(job, plan, log)
        run_steps(rebuild_steps(job, reload), plan, state, log, chain="rebuild", cleanup=cleanup)
    log("rebuild: {} installed and {} in {:.0f} s".format(
        plan.artifact, "reloaded" if target.pid or target.unit else "not reloaded", time.monotonic() - state.started))


# --- command line --------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)
    add_flags(p, BuildOptions, "engine", "calibrator", "accept_inconclusive")
    g = p.add_argument_group("capture")
    add_flags(g, Config, "build.min_images")
    add_flags(g, RebuildOptions, "capture_frames", "every", "max_images", "min_diff")
    g = p.add_argument_group("latency check")
    add_flags(g, RebuildOptions, "check_frames", "check_warmup", "check_source")
    g = p.add_argument_group("reload (exactly one; confirmed through the service's metrics)")
    add_flags(g, ReloadOptions, "pid", "pidfile", "systemd", "unit", "no_reload")
    add_flags(p, ReloadOptions, "dry_run", "keep_work")


def register(subparsers: Any) -> None:
    add_command(subparsers, "rebuild",
                "capture -> calibrate -> fallback -> build -> gate -> latency -> install -> reload", __doc__,
                add_arguments, cmd_rebuild)


def job_from_args(args: argparse.Namespace, stamp: str = "") -> "RebuildJob":
    """The RebuildJob the command line asks for: a flag not given takes its declared default."""
    from edge.model.rebuild import RebuildJob

    return RebuildJob(config_from_args(args), options_from(args, RebuildOptions),
                      keep_work=options_from(args, ReloadOptions).keep_work, stamp=stamp,
                      accept_inconclusive=options_from(args, BuildOptions).accept_inconclusive)


def cmd_rebuild(args: argparse.Namespace) -> int:
    from edge.model.rebuild import format_plan, preflight

    job = job_from_args(args, _utc_stamp())
    opts, build = options_from(args, ReloadOptions), options_from(args, BuildOptions)
    target = resolve_reload(job.cfg, opts)
    log = functools.partial(print, flush=True)
    plan = preflight(job, engine=build.engine, calibrator=build.calibrator, log=log)
    if opts.dry_run:
        print(format_plan(job, plan, target.describe()), flush=True)
        return EXIT_OK
    run_rebuild(job, plan, target, log)
    return EXIT_OK

