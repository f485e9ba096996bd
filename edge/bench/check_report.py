"""The `edge check` report, top to bottom: its shape (`build_report`) and text (`format_report`), then what the run
gathers beside the latency table (the per-frame series and the telemetry trace, both sinks; jtop's view of the
clocks) and the comparison with a previous report. The figure is edge/bench/check_figure.py."""

import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edge import __version__
from edge.bench import report
from edge.board import CLOCKS_OFF
from edge.config import Config
from edge.infer.latency import STAGES, format_table
from edge.infer.pipeline import Result, Sink
from edge.uri import redact

TELEMETRY_METRICS = (("temperature_c", "temperature (°C)"), ("gpu_clock_mhz", "GPU clock (MHz)"),
                     ("power_w", "power (W)"))


def build_report(cfg: Config, summary: Dict[str, Any], *, facts: Dict[str, Any], warning: Optional[str], frames: int,
                 duration_s: float, warnings: List[str], telemetry: Dict[str, Any],
                 system: Dict[str, Any]) -> Dict[str, Any]:
    """The report (edge.bench.report.SCHEMA_VERSION, docs/latency-check.md) of a run's `summary`
    (edge.service.loop.run) and what the check gathered beside it; `facts` are what the run's start line said
    about the model and backend."""
    stages = summary["stages_ms"]
    p99 = stages["end_to_end"]["p99"]
    budget = cfg.runtime.budget_ms
    passed = p99 <= budget
    reason = "p99 end_to_end {:.3f} ms {} budget {:g} ms".format(p99, "<=" if passed else ">", budget)
    cameras = summary.get("cameras")
    if cameras:  # several cameras: each one's p99 within the budget too
        worst, figures = max(((name, c["stages_ms"].get("end_to_end", {}).get("p99", 0.0)) for name, c in
                              cameras.items()), key=lambda item: item[1])
        passed = passed and figures <= budget
        reason += "; worst camera {} p99 {:.3f} ms".format(worst, figures)
    return {
        "schema_version": report.SCHEMA_VERSION,
        "tool": "edge check " + __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verdict": "pass" if passed else "fail",
        "verdict_reason": reason,
        "budget_ms": budget,
        "frames": summary["frames"],
        "frames_requested": frames,
        "warmup": cfg.runtime.warmup,
        "ended_by": summary["ended_by"],
        "duration_s": round(duration_s, 3),
        "fps": round(summary["frames"] / duration_s, 2) if duration_s > 0 else 0.0,
        "source": redact(str(facts.get("source", cfg.source.uri))),
        "backend": str(facts.get("backend", "?")),
        "precision": str(facts.get("precision", "?")),
        "preprocess": str(facts.get("preprocess", "?")),
        "chosen_because": str(facts.get("chosen_because", "")),
        "model": {"path": cfg.model.path, "sha256": None if facts.get("sha256") == "unknown" else facts.get("sha256"),
                  "weights": None if facts.get("weights") is None else str(facts["weights"]),
                  "trained": bool(facts.get("trained")), "warning": warning},
        "stages_ms": stages,
        "misses": summary["misses"],
        "miss_rate": summary["miss_rate"],
        "errors": summary.get("errors", 0),
        "skipped_frames": summary.get("skipped", 0),
        "warnings": warnings,
        "telemetry": telemetry,
        "system": system,
        "comparison": None,
        "figure": None,
        **({"cameras": cameras, "batches": summary.get("batches")} if cameras else {}),
    }


def format_report(report: Dict[str, Any]) -> str:
    """The trtexec-like table (edge.infer.latency.format_table) with a header, the verdict and any comparison."""
    header = ["edge check: {} {} {} on {} - {} frames after {} warm-up, {:.1f} fps".format(
        report["backend"], report["precision"], os.path.basename(report["model"]["path"]), report["source"],
        report["frames"], report["warmup"], report["fps"])]
    if report["model"].get("warning"):
        header.append(report["model"]["warning"])
    text = format_table(report, header)
    if report.get("cameras"):
        from edge.sources.cameras import format_cameras

        text += "\n" + format_cameras(report)
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


class SeriesSink(Sink):
    """Keeps every timed frame's stage times (bounded by `capacity`) for the figure, and the run's duration: from
    the first timed frame's capture to the last result."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.stage_ms = {name: np.full(capacity, np.nan) for name in STAGES}
        self.missed = np.zeros(capacity, bool)
        self.count = 0
        self.t0: Optional[float] = None  # time.monotonic() of the first timed frame's capture
        self.t1: Optional[float] = None

    def on_result(self, result: Result) -> None:
        self.t1 = time.monotonic()
        if self.t0 is None:
            self.t0 = self.t1 - result.stage_ms.get("end_to_end", 0.0) / 1e3
        if self.count >= self.capacity:
            return
        i = self.count
        for name, ms in result.stage_ms.items():
            if name in self.stage_ms:
                self.stage_ms[name][i] = ms
        self.missed[i] = result.status == "miss"
        self.count += 1

    def series(self, name: str) -> np.ndarray:
        return self.stage_ms[name][:self.count]

    def duration_s(self) -> float:
        return (self.t1 or 0.0) - (self.t0 or 0.0)


def with_jtop_clocks(clocks: Dict[str, Any], warnings: List[str], snap: Any) -> Tuple[Dict[str, Any], List[str]]:
    """On a Jetson, jtop's view of jetson_clocks (CPU, GPU and EMC pinned) wins over the sysfs guess."""
    if not clocks["jetson"] or snap is None or getattr(snap, "source", "") != "jtop":
        return clocks, warnings
    clocks = dict(clocks)
    if snap.jetson_clocks is not None:
        state = "on" if snap.jetson_clocks else "off"
        if state != clocks["jetson_clocks"]:
            warnings = [w for w in warnings if not w.startswith("jetson_clocks")]
            if state == "off":
                warnings.append(CLOCKS_OFF)
        clocks["jetson_clocks"] = state
    if clocks["nvpmodel"] is None and snap.nvpmodel:
        clocks["nvpmodel"] = snap.nvpmodel
    return clocks, warnings


class TelemetryTrace(Sink):
    """Telemetry samples (temperature, GPU clock, power) during the timed frames, from the snapshot each Result
    carries (jtop on a Jetson, /sys elsewhere: edge.service.telemetry's thread); unavailable with a reason."""

    def __init__(self, enabled: bool = True):
        self.samples: List[Tuple[float, Dict[str, Optional[float]]]] = []
        self.reason: Optional[str] = None if enabled else "disabled (service.telemetry.enabled: false)"
        self.source = ""
        self.first: Any = None  # the first snapshot (nvpmodel / jetson_clocks as jtop reports them)
        self._last_time: Optional[float] = None

    def on_result(self, result: Result) -> None:
        snap = result.telemetry
        if snap is None or snap.time == self._last_time:
            return
        self.first = self.first or snap
        self._last_time = snap.time
        self.source = snap.source + (" (degraded: {})".format(snap.degraded) if snap.degraded else "")
        temps = [t for t in (snap.temperatures or {}).values() if t is not None]
        values = {"temperature_c": max(temps) if temps else None, "gpu_clock_mhz": snap.gpu_freq_mhz,
                  "power_w": snap.power_w}  # numbers or None already (edge.service.telemetry)
        self.samples.append((time.monotonic(), values))

    def summary(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"status": "unavailable", "reason": self.reason, "samples": len(self.samples),
                               "source": self.source}
        out.update({m: None for m, _ in TELEMETRY_METRICS})
        if self.reason is not None:
            return out
        if not self.samples:
            out["reason"] = "no telemetry sample during the run"
            return out
        for metric, _ in TELEMETRY_METRICS:
            vals = [v[metric] for _, v in self.samples if v.get(metric) is not None]
            if vals:
                out[metric] = {"min": round(min(vals), 2), "mean": round(float(np.mean(vals)), 2),
                               "max": round(max(vals), 2)}
        if all(out[m] is None for m, _ in TELEMETRY_METRICS):
            out["reason"] = "{} telemetry has no temperature, GPU clock or power reading here".format(
                self.source or "the")
            return out
        out["status"] = "ok"
        return out


def load_previous(path: str) -> Dict[str, Any]:
    return report.load_previous(path, tool="edge check", rows="stages_ms")


def compare(current: Dict[str, Any], previous: Dict[str, Any], previous_path: str, *, pct: float,
            ms: float) -> Dict[str, Any]:
    """Per-stage p50/p99 deltas (edge.bench.report.judge: worse by more than `pct` percent AND `ms` ms)."""
    stages: Dict[str, Any] = {}
    regressions = []
    for name, now in current.items():
        before = previous["stages_ms"].get(name)
        if not isinstance(before, dict):
            continue
        entry = {}
        for q in ("p50", "p99"):
            judged = report.judge(before.get(q), now.get(q), pct=pct, ms=ms)
            if judged is None:
                continue
            entry[q], worse = judged
            if worse:
                e = entry[q]
                regressions.append("{} {} {:.3f} -> {:.3f} ms (+{:.3f} ms{})".format(
                    name, q, e["previous"], e["current"], e["delta_ms"],
                    "" if e["delta_pct"] is None else ", +{:.1f}%".format(e["delta_pct"])))
        if len(entry) == 2:
            stages[name] = entry
    return {"previous": previous_path, "thresholds": {"pct": pct, "ms": ms}, "stages": stages,
            "regressions": regressions}


def format_comparison(comparison: Dict[str, Any]) -> str:
    th = comparison["thresholds"]
    lines = ["vs {} (flag: worse by > {:g}% and > {:g} ms)".format(comparison["previous"], th["pct"], th["ms"]),
             "{:<12}{:>9}{:>9}{:>10}{:>9}{:>9}{:>10}".format("stage (ms)", "p50 was", "now", "", "p99 was", "now",
                                                              "")]
    for name, e in comparison["stages"].items():
        def cell(d: Dict[str, Any]) -> str:
            pct = "" if d["delta_pct"] is None else "{:+.0f}%".format(d["delta_pct"])
            return "{:>9.3f}{:>9.3f}{:>10}".format(d["previous"], d["current"], ("! " if d["regressed"] else "") + pct)
        lines.append("{:<12}{}{}".format(name, cell(e["p50"]), cell(e["p99"])))
    if comparison["regressions"]:
        lines.extend("REGRESSION " + r for r in comparison["regressions"])
    else:
        lines.append("no p50/p99 regressions")
    return "\n".join(lines)
