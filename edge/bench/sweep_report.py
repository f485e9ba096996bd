"""The `edge sweep` report: one cell's figures from its windows, when a cell is stable, the knee (the verdict), the
comparison with a previous sweep, and the text, CSV and JSON it is written as. The run is edge/cli/sweep.py,
the figure edge/bench/sweep_figure.py.

The knee is the cell with the largest goodput (results within the budget per second) among the stable cells whose
p99 end to end is within the budget and whose drop rate is within the drop budget; a tie goes to the smaller batch,
then to fewer cameras. "Max cameras" is the most cameras at --fps any such cell served. Where no such cell is stable
(a noisy machine: windows that never agreed within --max-windows), the knee is chosen the same way among the
unstable ones, marked unsettled, with the spread its windows showed and the duration that would settle it.
"""

import csv
import io
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edge import __version__
from edge.bench import report
from edge.bench.sweep_options import MAX_DURATION_S
from edge.errors import EdgeError
from edge.fields import show
from edge.infer.latency import STACKED

COLUMNS = ("streams", "batch", "fps_each", "offered_fps", "achieved_fps", "goodput_fps", "mean_batch", "batch_hist",
           "p50_ms", "p90_ms", "p99_ms", "max_ms", "queue_p99_ms", "infer_p99_ms", "miss_pct", "drop_pct",
           "camera_p99_spread_ms", "cpu_pct", "gpu_load_pct", "emc_mhz", "peak_rss_mb", "ram_used_pct",
           "context_memory_mb", "windows", "window_spread_pct", "stable", "knee")


@dataclass
class Window:
    """What one run of a cell served: per frame its stages, batch size, camera and status; and its counters."""

    seconds: float
    stage_ms: Dict[str, List[float]] = field(default_factory=lambda: {s: [] for s in STACKED + ("end_to_end",)})
    batch: List[int] = field(default_factory=list)
    camera: List[str] = field(default_factory=list)
    ok: List[bool] = field(default_factory=list)
    offered: int = 0  # frames the cameras gave between the first and the last served frame's reads
    produced: int = 0  # of those, the frames whose fate is known (up to each camera's last served one)
    dropped: int = 0  # of those, never served: superseded, expired or failed
    cpu_s: float = 0.0
    gpu_load: Optional[float] = None
    emc_mhz: Optional[float] = None
    peak_rss_mb: Optional[float] = None  # the process's peak resident memory during the window
    ram_fraction: Optional[float] = None  # the board's RAM in use (telemetry; on a Jetson shared with the GPU)

    @property
    def frames(self) -> int:
        return len(self.batch)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    def p99(self) -> float:
        e2e = self.stage_ms["end_to_end"]
        return float(np.percentile(e2e, 99)) if e2e else math.inf


def agree(windows: Sequence[Window], count: int, pct: float) -> bool:
    """The last `count` windows agree: throughput and p99 within `pct` percent (max / min) of each other."""
    return len(windows) >= count and spread_pct(windows[-count:]) <= pct


def spread_pct(windows: Sequence[Window]) -> float:
    """How far apart the windows are: the larger of throughput's and p99's max / min, as a percentage above 1
    (inf when a window served nothing)."""
    worst = 0.0
    for values in ([w.fps for w in windows], [w.p99() for w in windows]):
        low, high = min(values), max(values)
        if not (math.isfinite(high) and low > 0):
            return math.inf
        worst = max(worst, 100.0 * (high / low - 1.0))
    return worst


def _pct(values: Sequence[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)), 3) if len(values) else None


def cell_figures(windows: Sequence[Window], *, streams: int, batch: int, fps: Optional[float], budget_ms: float,
                 stable: bool, all_windows: int, context_memory_mb: Optional[float] = None) -> Dict[str, Any]:
    """One cell's row, pooled over `windows` (the ones that agree, or the last ones). `context_memory_mb`: the
    engine's execution contexts' device memory (TensorRT), the same in every cell."""
    seconds = sum(w.seconds for w in windows)
    e2e = [v for w in windows for v in w.stage_ms["end_to_end"]]
    sizes = np.array([b for w in windows for b in w.batch], int)
    frames, ok = len(e2e), sum(sum(w.ok) for w in windows)
    produced, dropped = sum(w.produced for w in windows), sum(w.dropped for w in windows)
    # batches of each size; a window's edge can cut a batch, whose recorded part still counts as one batch
    hist = {int(b): -(-int(np.sum(sizes == b)) // int(b)) for b in np.unique(sizes)}
    per_size = {str(b): _pct([v for w in windows for v, n in zip(w.stage_ms["infer"], w.batch) if n == b], 99)
                for b in hist}
    cameras: Dict[str, List[float]] = {}
    for w in windows:
        for name, v in zip(w.camera, w.stage_ms["end_to_end"]):
            cameras.setdefault(name, []).append(v)
    camera_p99 = {name: _pct(v, 99) for name, v in sorted(cameras.items())}
    spread = max(camera_p99.values()) - min(camera_p99.values()) if len(camera_p99) > 1 else 0.0  # type: ignore
    gpu = [w.gpu_load for w in windows if w.gpu_load is not None]
    emc = [w.emc_mhz for w in windows if w.emc_mhz is not None]
    rss = [w.peak_rss_mb for w in windows if w.peak_rss_mb is not None]
    ram = [w.ram_fraction for w in windows if w.ram_fraction is not None]
    apart = spread_pct(windows) if windows else math.inf
    return {
        "streams": streams, "batch": batch, "fps_each": fps,
        "offered_fps": round(sum(w.offered for w in windows) / seconds, 2) if fps and seconds else None,
        "achieved_fps": round(frames / seconds, 2) if seconds else 0.0,
        "goodput_fps": round(ok / seconds, 2) if seconds else 0.0,
        "mean_batch": round(frames / sum(hist.values()), 3) if hist else None,
        "batch_hist": hist,
        "p50_ms": _pct(e2e, 50), "p90_ms": _pct(e2e, 90), "p99_ms": _pct(e2e, 99),
        "max_ms": round(max(e2e), 3) if e2e else None,
        "queue_p99_ms": _pct([v for w in windows for v in w.stage_ms["frame_age"]], 99),
        "infer_p99_ms": per_size,
        "miss_pct": round(100.0 * (frames - ok) / frames, 3) if frames else None,
        "drop_pct": round(100.0 * dropped / produced, 3) if produced else 0.0,
        "camera_p99_ms": camera_p99, "camera_p99_spread_ms": round(spread, 3),
        "cpu_pct": round(100.0 * sum(w.cpu_s for w in windows) / seconds, 1) if seconds else None,
        "gpu_load_pct": round(100.0 * float(np.mean(gpu)), 1) if gpu else None,
        "emc_mhz": round(float(np.mean(emc)), 1) if emc else None,
        "peak_rss_mb": round(max(rss), 1) if rss else None,
        "ram_used_pct": round(100.0 * max(ram), 1) if ram else None,
        "context_memory_mb": context_memory_mb,
        "window_spread_pct": round(apart, 1) if math.isfinite(apart) else None,
        "window_s": round(seconds / len(windows), 3) if windows else None,
        "stage_mean_ms": {s: round(float(np.mean([v for w in windows for v in w.stage_ms[s]])), 3) if e2e else None
                          for s in STACKED},
        "windows": all_windows, "stable": stable, "knee": False,
        "budget_ms": budget_ms,
    }


def knee(cells: List[Dict[str, Any]], budget_ms: float,
         drop_budget_pct: float) -> Tuple[Optional[Dict[str, Any]], Optional[int], List[str], bool]:
    """(the knee cell, the most cameras served within the budgets, why each other cell was left out, whether the
    knee is settled). The knee is chosen among the stable cells within the budgets, else (settled False) among the
    unstable ones."""
    within = [c for c in cells if not _over(c, budget_ms, drop_budget_pct)]
    pool = [c for c in within if c["stable"]] or within
    settled = any(c["stable"] for c in pool)
    reasons = ["{}x{}: {}".format(c["streams"], c["batch"], _over(c, budget_ms, drop_budget_pct) or "not stable")
               for c in cells if c not in pool]
    if not pool:
        return None, None, reasons, False
    best = max(pool, key=lambda c: (c["goodput_fps"], -c["batch"], -c["streams"]))
    best["knee"] = True
    return best, max(c["streams"] for c in pool), reasons, settled


def _over(cell: Dict[str, Any], budget_ms: float, drop_budget_pct: float) -> str:
    if cell["p99_ms"] is None or cell["p99_ms"] > budget_ms:
        return "p99 {} ms over the budget".format(cell["p99_ms"])
    if cell["drop_pct"] > drop_budget_pct:
        return "drops {}% over {}%".format(cell["drop_pct"], drop_budget_pct)
    return ""


def settle_s(cell: Dict[str, Any], settings: Dict[str, Any]) -> Optional[float]:
    """The --duration that would likely let `cell`'s windows agree: a window's spread shrinks about as the square
    root of its length grows (None when its windows served nothing, or agreement is asked within 0 %)."""
    spread, window_s, agree_pct = cell.get("window_spread_pct"), cell.get("window_s"), settings.get("agree_pct")
    if not spread or not window_s or not agree_pct:
        return None
    return float(math.ceil(window_s * (spread / agree_pct) ** 2 * settings.get("windows", 1)))


def _settle_note(duration_s: Optional[float]) -> str:
    if duration_s is None:
        return ""
    if duration_s > MAX_DURATION_S:
        return "; no --duration up to {:g} s would likely settle it: measure on a quieter machine".format(
            MAX_DURATION_S)
    return "; about --duration {:g} would settle it".format(duration_s)


def build_report(cells: List[Dict[str, Any]], settings: Dict[str, Any], facts: Dict[str, Any],
                 system: Dict[str, Any]) -> Dict[str, Any]:
    budget, drop_budget = settings["budget_ms"], settings["drop_budget_pct"]
    best, cameras, reasons, settled = knee(cells, budget, drop_budget)
    if best is None:
        verdict, reason = "fail", "no cell meets p99 <= {:g} ms with drops <= {:g}%".format(budget, drop_budget)
    else:
        verdict = "pass" if settled else "unsettled"
        reason = "knee{}: {} cameras x batch {}: {:.1f} results/s within the budget, p99 {:.2f} ms".format(
            "" if settled else " (unsettled)", best["streams"], best["batch"], best["goodput_fps"], best["p99_ms"])
        if not settled:
            best["settle_duration_s"] = settle_s(best, settings)
            reason += "; its windows were {}% apart, not within {:g}% after {} windows{}".format(
                best["window_spread_pct"], settings.get("agree_pct", 0), best["windows"],
                _settle_note(best["settle_duration_s"]))
    return {
        "schema_version": report.SCHEMA_VERSION, "tool": "edge sweep " + __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verdict": verdict, "verdict_reason": reason,
        "knee": None if best is None else {"streams": best["streams"], "batch": best["batch"], "settled": settled},
        "max_cameras_within_budget": cameras, "left_out": reasons,
        "settings": settings, "facts": facts, "system": system, "cells": cells, "comparison": None,
        "figure": None, "output_errors": [],
    }


def format_report(report: Dict[str, Any]) -> str:
    s = report["settings"]
    facts = report["facts"]
    load = "{:g} fps per camera".format(s["fps"]) if s.get("fps") else "batches back to back"
    lines = ["edge sweep: {} {} {} - {} load, {}, budget {:g} ms, drop budget {:g}%".format(
        facts.get("backend", "?"), facts.get("precision", "?"), facts.get("model", "?"), s["load"], load,
        s["budget_ms"], s["drop_budget_pct"])]
    if facts.get("warning"):
        lines.append(facts["warning"])
    row = "{:>3} {:>3} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>5} {:>7} {:>5} {}{}"
    lines.append(row.format("cam", "bat", "offered", "achieved", "goodput", "batch", "p50", "p99", "max", "queue99",
                            "miss%", "drop%", "spread", "cpu%", "rss MB", "ram%", "stable", ""))
    for c in report["cells"]:
        stable = "yes" if c["stable"] else "no ({} apart)".format(
            "-" if c.get("window_spread_pct") is None else "{:g}%".format(c["window_spread_pct"]))
        lines.append(row.format(c["streams"], c["batch"], _num(c["offered_fps"], 1), _num(c["achieved_fps"], 1),
                                _num(c["goodput_fps"], 1), _num(c["mean_batch"], 2), _num(c["p50_ms"], 2),
                                _num(c["p99_ms"], 2), _num(c["max_ms"], 2), _num(c["queue_p99_ms"], 2),
                                _num(c["miss_pct"], 2), _num(c["drop_pct"], 2), _num(c["camera_p99_spread_ms"], 2),
                                _num(c["cpu_pct"], 0), _num(c.get("peak_rss_mb"), 0), _num(c.get("ram_used_pct"), 0),
                                stable, "  <- knee" if c["knee"] else ""))
    if facts.get("context_memory_mb") is not None:
        lines.append("engine contexts: {:g} MB of device memory (a Jetson's shared RAM)".format(
            facts["context_memory_mb"]))
    if report["comparison"]:
        lines.append(format_comparison(report["comparison"]))
    lines.append("{}: {}".format(report["verdict"].upper(), report["verdict_reason"]))
    if report["max_cameras_within_budget"] is not None and s.get("fps"):
        lines.append("max cameras at {:g} fps within the budget: {}".format(s["fps"],
                                                                           report["max_cameras_within_budget"]))
    return "\n".join(lines)


def _num(value: Any, digits: int) -> str:
    return "-" if value is None else "{:.{}f}".format(value, digits)


def to_csv(report: Dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for c in report["cells"]:
        row = []
        for column in COLUMNS:
            value = c[column]
            if column == "batch_hist":
                value = " ".join("{}:{}".format(k, v) for k, v in sorted(value.items()))
            elif column == "infer_p99_ms":
                value = " ".join("{}:{}".format(k, v) for k, v in sorted(value.items(), key=lambda kv: int(kv[0])))
            row.append("" if value is None else value)
        writer.writerow(row)
    return out.getvalue()


COMPARED = ("goodput_fps", "p99_ms")  # what `compare` reads of a previous cell, beside its streams and batch


def load_previous(path: str) -> Dict[str, Any]:
    """A previous sweep, every cell `compare` reads checked here, before any cell runs."""
    return report.load_previous(path, tool="edge sweep", rows="cells", check_row=_check_cell)


def _check_cell(path: str, where: str, cell: Any) -> None:
    if not isinstance(cell, dict):
        raise EdgeError("{}: '{}' must be a mapping, got {}".format(path, where, show(cell)))
    for key in ("streams", "batch"):
        value = cell.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise EdgeError("{}: '{}.{}' must be a whole number, got {}".format(path, where, key, show(value)))
    for key in COMPARED:
        value = cell.get(key)
        if value is not None and report.finite(value) is None:
            raise EdgeError("{}: '{}.{}' must be a finite number or null, got {}".format(path, where, key,
                                                                                         show(value)))


def compare(cells: List[Dict[str, Any]], previous: Dict[str, Any], path: str, *, pct: float,
            ms: float) -> Dict[str, Any]:
    """Cell by cell (same cameras and batch), by edge.bench.report.judge: goodput lower by more than `pct` percent,
    or p99 higher by more than `pct` percent and `ms` ms, is a regression."""
    before = {(c.get("streams"), c.get("batch")): c for c in previous["cells"] if isinstance(c, dict)}
    rows, regressions = [], []
    for c in cells:
        old = before.get((c["streams"], c["batch"]))
        if old is None:
            continue
        row = {"streams": c["streams"], "batch": c["batch"]}
        for key in COMPARED:
            judged = report.judge(old.get(key), c[key], pct=pct, ms=ms, higher_is_worse=key != "goodput_fps")
            row[key] = judged[0] if judged else {"previous": report.finite(old.get(key)),
                                                  "current": report.finite(c[key])}
            if judged and judged[1]:
                e = judged[0]
                regressions.append("{}x{} {} {:.2f} -> {:.2f} ({:+.1f}%)".format(
                    c["streams"], c["batch"], key, e["previous"], e["current"], e["delta_pct"]))
        rows.append(row)
    return {"previous": path, "thresholds": {"pct": pct, "ms": ms}, "cells": rows, "regressions": regressions}


def format_comparison(comparison: Dict[str, Any]) -> str:
    lines = ["vs {}: {} cells compared (flag: goodput down > {:g}%, p99 up > {:g}% and > {:g} ms)".format(
        comparison["previous"], len(comparison["cells"]), comparison["thresholds"]["pct"],
        comparison["thresholds"]["pct"], comparison["thresholds"]["ms"])]
    lines.extend("REGRESSION " + r for r in comparison["regressions"])
    if not comparison["regressions"]:
        lines.append("no goodput or p99 regressions")
    return "\n".join(lines)
