"""`edge check`: the on-device latency check, a trtexec-style summary of the real pipeline against the budget.

    edge check --config /etc/jetson-edge/config.yaml --frames 1000 --json check.json --plot check.png

Warm-up, then N timed frames through the same Runtime `edge run` uses (source -> preprocess -> infer ->
postprocess), per-stage p50/p90/p99/max/mean, budget misses and a verdict: PASS when the p99 of
end_to_end (capture -> result) is within `runtime.budget_ms`. Exit 0 pass, 1 fail, 2 could not run.
Writes a JSON report (docs/latency-check.md) and a 1200x900 figure (histogram, per-frame
stacked stages, telemetry traces). `--compare previous.json` flags per-stage p50/p99 regressions.
"""

import argparse
import io
import os
import sys
from typing import Any, Callable, Dict, Optional, Sequence

from edge.commands.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.config import Config, with_overrides
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError, require
from edge.fileio import check_output, write_json_atomic

DEFAULT_FRAMES = 1000
DEFAULT_WARMUP = 50
REGRESSION_PCT = 10.0  # a stage's p50/p99 is flagged when it got worse by more than this many percent ...
REGRESSION_MS = 0.2  # ... and by more than this many milliseconds
MAX_FRAMES = 1000000  # the per-frame series are kept in memory (6 stages x 8 bytes per frame)


def run_check(cfg: Config, frames: int, json_path: Optional[str] = None, plot_path: Optional[str] = None,
              previous: Optional[str] = None, regression_pct: float = REGRESSION_PCT,
              regression_ms: float = REGRESSION_MS, clock_root: str = "/",
              out: Callable[[str], None] = print, warn: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run the check with config `cfg` (its runtime.warmup and runtime.budget_ms apply); returns the report.

    Input problems raise EdgeError (exit 2) before any frame is timed. The verdict is in report['verdict'].
    """
    from edge.board import clock_state, system_info
    from edge.commands.check_figure import plot
    from edge.commands.check_report import (
        SeriesSink,
        TelemetryTrace,
        build_report,
        compare,
        format_report,
        load_previous,
        with_jtop_clocks,
    )
    from edge.service.log import JsonLog
    from edge.service.loop import run
    from edge.service.runtime import Runtime

    _check_inputs(frames, json_path, plot_path, regression_pct, regression_ms)
    prev = load_previous(previous) if previous else None
    cfg = with_overrides(cfg, {
        "runtime.frames": frames,
        "runtime.latency_window": max(cfg.runtime.latency_window, frames),  # exact percentiles over the whole run
        "service.telemetry.interval_s": min(cfg.service.telemetry.interval_s, 0.5),  # a few samples per second
        "service.metrics.enabled": False})  # the service may be running with the same config and hold the port
    clocks, warnings = clock_state(clock_root)
    series, telemetry = SeriesSink(frames), TelemetryTrace(cfg.service.telemetry.enabled)
    runtime = Runtime(cfg, [series, telemetry], JsonLog(stream=io.StringIO()))  # the check prints its own table
    summary = run(runtime)
    if summary["frames"] == 0:
        raise EdgeError("{}: the source ended before any timed frame (warm-up {} frames); use a longer clip{}".format(
            cfg.source.uri, cfg.runtime.warmup, "" if cfg.source.loop else " or source.loop: true"))
    clocks, warnings = with_jtop_clocks(clocks, warnings, telemetry.first)
    if summary["ended_by"] != "frames":
        warnings.append("source ended after {} of {} frames".format(summary["frames"], frames))
    report = build_report(cfg, runtime.facts, runtime.stages.warning, summary, frames, series.duration_s(),
                          warnings, telemetry.summary(), system_info(clocks))
    if prev:
        report["comparison"] = compare(report["stages_ms"], prev, previous or "", regression_pct, regression_ms)
    if plot_path:
        report["figure"] = plot(plot_path, report, series, telemetry.samples, series.t0 or 0.0)
    if json_path:
        write_json_atomic(json_path, report, "JSON report")
    for line in warnings:
        warn("warning: " + line)
    out(format_report(report))
    return report


def _check_inputs(frames: int, json_path: Optional[str], plot_path: Optional[str], regression_pct: float,
                  regression_ms: float) -> None:
    """Bad flags and unwritable outputs are refused before the run, not after it."""
    if not 1 <= frames <= MAX_FRAMES:
        raise EdgeError("--frames must be 1-{}, got {}".format(MAX_FRAMES, frames))
    for flag, value in (("--regression-pct", regression_pct), ("--regression-ms", regression_ms)):
        if not 0 <= value < 1e9:  # also refuses NaN, which would flag nothing
            raise EdgeError("{} must be a number >= 0, got {}".format(flag, value))
    for path, what in ((json_path, "JSON report"), (plot_path, "figure")):
        if path:
            check_output(path, what)
    if json_path and plot_path and os.path.abspath(json_path) == os.path.abspath(plot_path):
        raise EdgeError("{}: --json and --plot name the same file".format(json_path))
    if plot_path:
        require("matplotlib")


# --- command line ------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)
    p.add_argument("--frames", type=int, default=DEFAULT_FRAMES, help="timed frames (default %(default)s)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed frames first (default %(default)s)")
    p.add_argument("--json", default="latency-check.json", metavar="PATH",
                   help="JSON report (default %(default)s; '' for none)")
    p.add_argument("--plot", default="latency-check.png", metavar="PATH",
                   help="PNG figure, 1200x900 px (default %(default)s; '' for none)")
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
