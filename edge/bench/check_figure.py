"""The `edge check` figure: latency histogram with the budget line, per-frame stacked stages, telemetry traces."""

from typing import Any, Dict, List, Tuple

import numpy as np

from edge.bench.check_report import TELEMETRY_METRICS, SeriesSink
from edge.bench.report import STAGE_COLOURS, new_figure, save_figure
from edge.infer.latency import STACKED


def plot(path: str, report: Dict[str, Any], series: SeriesSink, telemetry: List[Tuple[float, Dict[str, Any]]],
         t0: float) -> Dict[str, Any]:
    """Histogram with the budget line, per-frame stacked stages, telemetry traces: a FIGURE_PX PNG."""
    fig = new_figure()
    grid = fig.add_gridspec(3, 3, height_ratios=(1.0, 1.2, 0.75), left=0.06, right=0.98, top=0.9, bottom=0.06,
                            hspace=0.45, wspace=0.25)
    budget = report["budget_ms"]
    verdict = report["verdict"].upper()
    title = "edge check: {} - p99 end_to_end {:.2f} ms, budget {:g} ms - {} {} - {} frames, {}".format(
        verdict, report["stages_ms"]["end_to_end"]["p99"], budget, report["backend"], report["precision"],
        report["frames"], report["system"]["hostname"])
    fig.suptitle(title, fontsize=12, color="#1a7f37" if verdict == "PASS" else "#cf222e", y=0.985)
    subtitle = "; ".join(([report["model"]["warning"]] if report["model"].get("warning") else [])
                         + report["warnings"])
    if subtitle:
        fig.text(0.5, 0.935, subtitle[:180], ha="center", fontsize=9, color="#9a6700")
    _histogram(fig.add_subplot(grid[0, :]), report, series)
    _stacked(fig.add_subplot(grid[1, :]), budget, series)
    for col, (metric, label) in enumerate(TELEMETRY_METRICS):
        _trace(fig.add_subplot(grid[2, col]), metric, label, report["telemetry"], telemetry, t0)
    return save_figure(path, fig)


def _histogram(ax: Any, report: Dict[str, Any], series: SeriesSink) -> None:
    budget = report["budget_ms"]
    e2e = series.series("end_to_end")
    e2e = e2e[np.isfinite(e2e)]
    top = float(np.max(e2e)) if e2e.size else 1.0
    p99 = report["stages_ms"]["end_to_end"]["p99"]
    hi = min(top, max(p99, budget if budget <= 2.0 * top else 0.0) * 1.5) or 1.0  # the tail beyond: counted
    ax.hist(np.minimum(e2e, hi), bins=60, range=(0.0, hi * 1.001), color="#4c72b0")
    for q, style in (("p50", ":"), ("p99", "--")):
        v = report["stages_ms"]["end_to_end"][q]
        ax.axvline(v, color="black", linestyle=style, linewidth=1)
        ax.text(v, ax.get_ylim()[1] * 0.92, " " + q, fontsize=8)
    notes = []
    beyond = int(np.sum(e2e > hi))
    if beyond:
        notes.append("{} frames > {:.1f} ms in the last bin (max {:.1f} ms)".format(beyond, hi, top))
    if budget <= hi:
        ax.axvline(budget, color="#cf222e", linewidth=2)
        ax.text(budget, ax.get_ylim()[1] * 0.8, " budget {:g} ms".format(budget), color="#cf222e", fontsize=9)
    else:
        notes.append("budget {:g} ms off scale ->".format(budget))
    if notes:
        ax.text(0.995, 0.85, "\n".join(notes), transform=ax.transAxes, ha="right", va="top", color="#cf222e",
                fontsize=9)
    ax.set_xlabel("end_to_end (capture -> result), ms")
    ax.set_ylabel("frames")
    ax.set_title("latency histogram: {} misses of {} ({:.2%})".format(report["misses"], report["frames"],
                                                                      report["miss_rate"]), fontsize=10)


def _stacked(ax: Any, budget: float, series: SeriesSink) -> None:
    x = np.arange(1, series.count + 1)
    stacks = [np.nan_to_num(series.series(s)) for s in STACKED]
    ax.stackplot(x, *stacks, labels=STACKED, colors=STAGE_COLOURS, linewidth=0)
    ax.plot(x, series.series("end_to_end"), color="black", linewidth=0.6, label="end_to_end")
    missed = series.missed[:series.count]
    if missed.any():
        ax.plot(x[missed], series.series("end_to_end")[missed], "x", color="#cf222e", markersize=4, label="miss")
    ymax = float(np.nanmax(series.series("end_to_end"))) if series.count else 1.0
    if budget <= 2.0 * ymax:
        ax.axhline(budget, color="#cf222e", linewidth=1.5, label="budget")
    ax.set_xlim(1, max(2, series.count))
    ax.set_ylim(0, max(ymax, budget if budget <= 2.0 * ymax else 0) * 1.08 or 1.0)
    ax.set_xlabel("timed frame")
    ax.set_ylabel("ms")
    ax.set_title("per-frame stages (stacked)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8, ncol=7)


def _trace(ax: Any, metric: str, label: str, tele: Dict[str, Any], telemetry: List[Tuple[float, Dict[str, Any]]],
           t0: float) -> None:
    points = [(t - t0, v[metric]) for t, v in telemetry if v.get(metric) is not None]
    if points:
        ts, vs = zip(*points)
        ax.plot(ts, vs, color="#8172b3", marker=".", linewidth=1)
        ax.set_xlabel("s since first timed frame")
    else:
        why = tele["reason"] if tele["status"] != "ok" else "not reported by this system"
        ax.text(0.5, 0.5, "unavailable:\n" + _wrap(why or "", 40), ha="center", va="center",
                transform=ax.transAxes, fontsize=8, color="#6e7781")
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_title(label, fontsize=10)


def _wrap(text: str, width: int) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = (line + " " + w).strip()
    return "\n".join(lines + [line])
