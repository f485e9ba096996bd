"""`edge check`: the on-device latency check, a trtexec-style summary of the real pipeline against the budget.

    edge check --config /etc/jetson-edge/config.yaml --frames 1000 --json check.json --plot check.png

Warm-up, then N timed frames through the same Runtime `edge run` uses (source -> preprocess -> infer ->
postprocess), per-stage p50/p90/p99/max/mean, budget misses and a verdict: PASS when the p99 of
end_to_end (capture -> result) is within `runtime.budget_ms`. Exit 0 pass, 1 fail, 2 could not run.
Writes a JSON report (SCHEMA below, docs/latency-check.md) and a FIGURE_PX figure (histogram, per-frame
stacked stages, telemetry traces). `--compare previous.json` flags per-stage p50/p99 regressions.
"""

import argparse
import io
import os
import sys
import time
from typing import Any, Callable, Dict, Optional, Sequence

from edge import __version__
from edge.board import clock_state, system_info
from edge.commands.check_figure import FIGURE_PX, plot
from edge.commands.check_report import (
    REGRESSION_MS,
    REGRESSION_PCT,
    SCHEMA_VERSION,
    TELEMETRY_METRICS,
    SeriesSink,
    TelemetryTrace,
    compare,
    format_comparison,
    load_previous,
    with_jtop_clocks,
)
from edge.commands.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.config import Config, with_overrides
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError, require
from edge.fileio import check_output
from edge.frame.latency import format_table
from edge.modelinfo import write_json_atomic
from edge.service.log import JsonLog
from edge.service.loop import frames_done, run
from edge.service.runtime import Runtime, StopFlag

DEFAULT_FRAMES = 1000
DEFAULT_WARMUP = 50
MAX_FRAMES = 1000000  # the per-frame series are kept in memory (6 stages x 8 bytes per frame)


def run_check(cfg: Config, frames: int, json_path: Optional[str] = None, plot_path: Optional[str] = None,
              previous: Optional[str] = None, regression_pct: float = REGRESSION_PCT,
              regression_ms: float = REGRESSION_MS, clock_root: str = "/",
              out: Callable[[str], None] = print, warn: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run the check with config `cfg` (its runtime.warmup and runtime.budget_ms apply); returns the report.

    Input problems raise EdgeError (exit 2) before any frame is timed. The verdict is in report['verdict'].
    """
    if not 1 <= frames <= MAX_FRAMES:
        raise EdgeError("--frames must be 1-{}, got {}".format(MAX_FRAMES, frames))
    for flag, value in (("--regression-pct", regression_pct), ("--regression-ms", regression_ms)):
        if not 0 <= value < 1e9:  # also refuses NaN, which would flag nothing
            raise EdgeError("{} must be a number >= 0, got {}".format(flag, value))
    prev = load_previous(previous) if previous else None
    for path, what in ((json_path, "JSON report"), (plot_path, "figure")):
        if path:
            check_output(path, what)  # before the run, not after it
    if json_path and plot_path and os.path.abspath(json_path) == os.path.abspath(plot_path):
        raise EdgeError("{}: --json and --plot name the same file".format(json_path))
    if plot_path:
        require("matplotlib")
    cfg = with_overrides(cfg, {
        "runtime.latency_window": max(cfg.runtime.latency_window, frames),  # exact percentiles over the whole run
        "service.telemetry.interval_s": min(cfg.service.telemetry.interval_s, 0.5),  # a few samples per second
        "service.metrics.enabled": False})  # the service may be running with the same config and hold the port
    clocks, warnings = clock_state(clock_root)
    telemetry = TelemetryTrace(cfg.service.telemetry.interval_s, cfg.service.telemetry.enabled)
    series = SeriesSink(frames, telemetry.poll)
    runtime = Runtime(cfg, JsonLog(stream=io.StringIO()), [series])  # the check prints its own table
    timed = _TimedFrames(frames, cfg.runtime.warmup, runtime, telemetry)
    try:
        summary = run(stop=StopFlag(), runtime=runtime, until=timed)
    finally:
        telemetry.stop()
    if summary["frames"] == 0:
        raise EdgeError("{}: the source ended before any timed frame (warm-up {} frames); use a longer clip{}".format(
            cfg.source.uri, cfg.runtime.warmup, "" if cfg.source.loop else " or source.loop: true"))
    clocks, warnings = with_jtop_clocks(clocks, warnings, telemetry.first)
    if summary["ended_by"] != "frames":
        warnings.append("source ended after {} of {} frames".format(summary["frames"], frames))
    report = _report(cfg, runtime, summary, frames, timed.elapsed(), warnings, telemetry, system_info(clocks))
    if prev:
        report["comparison"] = compare(report["stages_ms"], prev, previous or "", regression_pct, regression_ms)
    if plot_path:
        report["figure"] = plot(plot_path, report, series, telemetry.samples, timed.t0 or 0.0)
    if json_path:
        write_json_atomic(json_path, report, "JSON report")
    for line in warnings:
        warn("warning: " + line)
    out(format_report(report))
    return report


class _TimedFrames:
    """The check's stop condition: `frames` timed frames. Starts the telemetry trace and the clock when the
    first timed frame is about to run (after the warm-up frames)."""

    def __init__(self, frames: int, warmup: int, runtime: Runtime, telemetry: TelemetryTrace):
        self.done = frames_done(frames)
        self.warmup = warmup
        self.runtime = runtime
        self.telemetry = telemetry
        self.t0: Optional[float] = None
        self.t1: Optional[float] = None

    def __call__(self, pipeline: Any) -> Optional[str]:
        if self.t0 is None and pipeline.frame_id >= self.warmup:
            self.telemetry.start(self.runtime)
            self.t0 = time.monotonic()
        reason = self.done(pipeline)
        if reason:
            self.t1 = time.monotonic()
        return reason

    def elapsed(self) -> float:
        if self.t0 is None:
            return 0.0
        return (self.t1 or time.monotonic()) - self.t0


def _report(cfg: Config, runtime: Runtime, summary: Dict[str, Any], frames: int, duration_s: float,
            warnings: Any, telemetry: TelemetryTrace, system: Dict[str, Any]) -> Dict[str, Any]:
    facts = runtime.facts
    stages = summary["stages_ms"]
    p99 = stages["end_to_end"]["p99"]
    budget = cfg.runtime.budget_ms
    passed = p99 <= budget
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "edge check " + __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verdict": "pass" if passed else "fail",
        "verdict_reason": "p99 end_to_end {:.3f} ms {} budget {:g} ms".format(p99, "<=" if passed else ">", budget),
        "budget_ms": budget,
        "frames": summary["frames"],
        "frames_requested": frames,
        "warmup": cfg.runtime.warmup,
        "ended_by": summary["ended_by"],
        "duration_s": round(duration_s, 3),
        "fps": round(summary["frames"] / duration_s, 2) if duration_s > 0 else 0.0,
        "source": str(facts.get("source", cfg.source.uri)),
        "backend": str(facts.get("backend", "?")),
        "precision": str(facts.get("precision", "?")),
        "preprocess": str(facts.get("preprocess", "?")),
        "chosen_because": str(facts.get("chosen_because", "")),
        "model": {"path": cfg.model.path, "sha256": None if facts.get("sha256") == "unknown" else facts.get("sha256"),
                  "weights": None if facts.get("weights") is None else str(facts["weights"]),
                  "trained": bool(facts.get("trained")), "warning": runtime.stages.warning},
        "stages_ms": stages,
        "misses": summary["misses"],
        "miss_rate": summary["miss_rate"],
        "errors": summary.get("errors", 0),
        "skipped_frames": summary.get("skipped", 0),
        "warnings": warnings,
        "telemetry": telemetry.summary(),
        "system": system,
        "comparison": None,
        "figure": None,
    }


def format_report(report: Dict[str, Any]) -> str:
    """The trtexec-like table (edge.frame.latency.format_table) with a header, the verdict and any comparison."""
    header = ["edge check: {} {} {} on {} - {} frames after {} warm-up, {:.1f} fps".format(
        report["backend"], report["precision"], os.path.basename(report["model"]["path"]), report["source"],
        report["frames"], report["warmup"], report["fps"])]
    if report["model"].get("warning"):
        header.append(report["model"]["warning"])
    text = format_table(report, header)
    tele = report["telemetry"]
    if tele["status"] == "ok":
        parts = ["{} {:.1f}/{:.1f}/{:.1f}".format(m, tele[m]["min"], tele[m]["mean"], tele[m]["max"])
                 for m, _ in TELEMETRY_METRICS if tele[m]]
        text += "\ntelemetry min/mean/max: " + ", ".join(parts)
    else:
        text += "\ntelemetry: unavailable ({})".format(tele["reason"])
    if report["comparison"]:
        text += "\n" + format_comparison(report["comparison"])
    text += "\ncapture->result {}: {}".format(report["verdict"].upper(), report["verdict_reason"])
    return text


# --- command line ------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)
    p.add_argument("--frames", type=int, default=DEFAULT_FRAMES, help="timed frames (default %(default)s)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed frames first (default %(default)s)")
    p.add_argument("--json", default="latency-check.json", metavar="PATH",
                   help="JSON report (default %(default)s; '' for none)")
    p.add_argument("--plot", default="latency-check.png", metavar="PATH",
                   help="PNG figure, {}x{} px (default %(default)s; '' for none)".format(*FIGURE_PX))
    p.add_argument("--compare", metavar="PATH", help="a previous report: flag per-stage p50/p99 regressions")
    p.add_argument("--regression-pct", type=float, default=REGRESSION_PCT,
                   help="flag when worse by more than this %% ... (default %(default)s)")
    p.add_argument("--regression-ms", type=float, default=REGRESSION_MS,
                   help="... and by more than this many ms (default %(default)s)")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when a regression is flagged")


def register(subparsers: Any) -> None:
    add_command(subparsers, "check", "latency check: N frames through the pipeline against the budget",
                __doc__, add_arguments, cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    if args.warmup < 0:
        raise EdgeError("--warmup must be >= 0, got {}".format(args.warmup))
    cfg = config_from_args(args, {"runtime.warmup": args.warmup})
    report = run_check(cfg, args.frames, args.json or None, args.plot or None, args.compare,
                       args.regression_pct, args.regression_ms,
                       out=lambda s: print(s, flush=True), warn=lambda s: print("edge check: " + s, file=sys.stderr))
    if report["verdict"] != "pass":
        return EXIT_FAIL
    if args.fail_on_regression and report["comparison"] and report["comparison"]["regressions"]:
        return EXIT_FAIL
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge check") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_check, argv)


if __name__ == "__main__":
    sys.exit(main())
