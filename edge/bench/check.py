"""The on-device latency check's run: warm-up, then N timed frames through the same Runtime `edge run` uses, a
report (edge.bench.check_report) with a verdict, and that verdict read back by those that run the check: `edge check`
(edge/cli/check.py, its command line) and the rebuild's latency step, in the rebuild's own process."""

import io
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from edge.bench.report import check_outputs
from edge.config import Config, with_overrides
from edge.errors import EdgeError, first_line
from edge.fields import check_options, declared_range, setting
from edge.store.fileio import write_json_atomic

MAX_FRAMES = 1000000  # the per-frame series are kept in memory (6 stages x 8 bytes per frame)
_WARMUP_LOW, _WARMUP_HIGH = declared_range(Config, "runtime.warmup")  # --warmup sets runtime.warmup


@dataclass(frozen=True)
class RegressionOptions:
    """What `--compare` flags as a regression, declared once for every command that compares with a previous report
    (`edge check`, `edge sweep`): worse by more than both."""

    regression_pct: float = setting(10.0, "flag a figure worse by more than this % ...", low=0.0, high=1e9,
                                    flag="--regression-pct")
    regression_ms: float = setting(0.2, "... and a latency by more than this many ms", low=0.0, high=1e9,
                                   flag="--regression-ms")
    compare: str = setting("", "a previous report of this command: flag what got worse (check: per-stage "
                               "p50/p99; sweep: cells)", flag="--compare", metavar="PATH")
    fail_on_regression: bool = setting(False, "exit 1 when a regression is flagged", flag="--fail-on-regression")


@dataclass(frozen=True)
class CheckOptions(RegressionOptions):
    """`edge check`'s own flags with their defaults and bounds, declared once (edge.fields); a caller that runs the
    check in code (the rebuild's latency step) builds these."""

    frames: int = setting(1000, "timed frames", low=1, high=MAX_FRAMES, flag="--frames")
    warmup: int = setting(50, "frames run first and not timed (engine, caches, clocks)", low=_WARMUP_LOW,
                          high=_WARMUP_HIGH, flag="--warmup")
    json: str = setting("latency-check.json", "JSON report ('' for none)", flag="--json")
    plot: str = setting("latency-check.png", "PNG figure, 1200x900 px ('' for none)", flag="--plot")

    def outputs(self) -> List[Tuple[str, str]]:
        return [(p, what) for p, what in ((self.json, "JSON report"), (self.plot, "figure")) if p]


def run_check(cfg: Config, options: CheckOptions, *, clock_root: str = "/",
              out: Callable[[str], None] = print, warn: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run the check with config `cfg` (its runtime.budget_ms applies; options.warmup is its runtime.warmup);
    returns the report.

    Input problems raise EdgeError (exit 2) before any frame is timed. The verdict is in report['verdict'].
    """
    from edge.bench.check_figure import plot
    from edge.bench.check_report import (
        SeriesSink,
        TelemetryTrace,
        build_report,
        compare,
        format_report,
        load_previous,
        with_jtop_clocks,
    )
    from edge.board import clock_state, system_info
    from edge.service.log import JsonLog
    from edge.service.loop import run
    from edge.service.runtime import Runtime

    check_options(options)
    frames, json_path, plot_path = options.frames, options.json or None, options.plot or None
    check_outputs(options.outputs(), "--json and --plot")
    prev = load_previous(options.compare) if options.compare else None
    cfg = with_overrides(cfg, {
        "runtime.frames": frames,
        "runtime.warmup": options.warmup,
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
    report = build_report(cfg, summary, facts=runtime.facts, warning=runtime.stages.warning, frames=frames,
                          duration_s=series.duration_s(), warnings=warnings, telemetry=telemetry.summary(),
                          system=system_info(clocks))
    if prev:
        report["comparison"] = compare(report["stages_ms"], prev, options.compare, pct=options.regression_pct,
                                       ms=options.regression_ms)
    if plot_path:
        report["figure"] = plot(plot_path, report, series, telemetry.samples, series.t0 or 0.0)
    if json_path:
        write_json_atomic(json_path, report, "JSON report")
    for line in warnings:
        warn("warning: " + line)
    out(format_report(report))
    return report


VERDICT_KEYS = ("verdict", "verdict_reason", "budget_ms", "frames", "misses", "miss_rate")


@dataclass(frozen=True)
class CheckVerdict:
    passed: bool
    reason: str
    summary: Dict[str, Any]  # VERDICT_KEYS and end_to_end p50_ms/p99_ms: what an artifact's model info records


def verdict(report: Any, where: str) -> CheckVerdict:
    """What a check concluded, from its report (`where`: the report's file, for the error). The one reader of the
    report's keys besides their writer (check_report): callers use the CheckVerdict."""
    try:
        summary = {key: report[key] for key in VERDICT_KEYS}
        end_to_end = report["stages_ms"]["end_to_end"]
        summary.update(p50_ms=end_to_end["p50"], p99_ms=end_to_end["p99"])
    except (KeyError, TypeError) as exc:
        raise EdgeError("{}: not a latency report ({})".format(where, first_line(exc))) from None
    return CheckVerdict(summary["verdict"] == "pass", str(summary["verdict_reason"]), summary)
