"""What `edge check` gathers besides the latency table: the per-frame series, the telemetry trace during the
timed frames, jtop's view of the clocks, and the comparison with a previous report."""

import math
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from edge.errors import EdgeError
from edge.fileio import load_json
from edge.frame.latency import STAGES
from edge.frame.pipeline import Result, Sink

SCHEMA_VERSION = 1


REGRESSION_PCT = 10.0  # a stage's p50/p99 is flagged when it got worse by more than this many percent ...


REGRESSION_MS = 0.2  # ... and by more than this many milliseconds


TELEMETRY_METRICS = (("temperature_c", "temperature (°C)"), ("gpu_clock_mhz", "GPU clock (MHz)"),
                     ("power_w", "power (W)"))


class SeriesSink(Sink):
    """Keeps every timed frame's stage times (bounded by `capacity`) for the figure."""

    def __init__(self, capacity: int, on_frame: Optional[Callable[[], None]] = None):
        self.capacity = capacity
        self.on_frame = on_frame  # e.g. TelemetryTrace.poll: an attribute read per frame
        self.stage_ms = {name: np.full(capacity, np.nan) for name in STAGES}
        self.missed = np.zeros(capacity, bool)
        self.count = 0

    def on_result(self, result: Result) -> None:
        if self.count >= self.capacity:
            return
        i = self.count
        for name, ms in result.stage_ms.items():
            if name in self.stage_ms:
                self.stage_ms[name][i] = ms
        self.missed[i] = result.status == "miss"
        self.count += 1
        if self.on_frame is not None:
            self.on_frame()

    def series(self, name: str) -> np.ndarray:
        return self.stage_ms[name][:self.count]


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
                warnings.append("jetson_clocks is off: DVFS makes timings noisy (sudo jetson_clocks)")
        clocks["jetson_clocks"] = state
    if clocks["nvpmodel"] is None and snap.nvpmodel:
        clocks["nvpmodel"] = snap.nvpmodel
    return clocks, warnings


class TelemetryTrace:
    """Telemetry samples (temperature, GPU clock, power) during the timed frames; unavailable with a reason.

    Reads edge.service.telemetry's side thread (jtop on a Jetson, /sys elsewhere): `poll()` is an attribute read,
    called once per timed frame, keeping each new snapshot. It never raises.
    """

    def __init__(self, interval_s: float = 0.5, enabled: bool = True):
        self.interval_s = interval_s
        self.samples: List[Tuple[float, Dict[str, Optional[float]]]] = []
        self.reason: Optional[str] = None if enabled else "disabled (service.telemetry.enabled: false)"
        self.source = ""
        self.first: Any = None  # the first snapshot (nvpmodel / jetson_clocks as jtop reports them)
        self._telemetry: Any = None
        self._own: Any = None  # a Telemetry this trace started (and stops)
        self._last_time: Optional[float] = None

    def start(self, runtime: Any = None) -> "TelemetryTrace":
        """Follow the runtime's own Telemetry thread when it runs one, else start one."""
        if self.reason is not None:
            return self
        try:
            telemetry = getattr(runtime, "telemetry", None)
            if telemetry is None:
                from edge.service.telemetry import Telemetry

                telemetry = self._own = Telemetry(self.interval_s).start()
            self._telemetry = telemetry
            self.first = telemetry.latest()
        except Exception as exc:  # no module, no sysfs, jtop broken: the check runs without telemetry
            self.reason = "{}: {}".format(type(exc).__name__, exc)
            self._telemetry = None
        return self

    def poll(self) -> None:
        if self._telemetry is None:
            return
        snap = self._telemetry.latest()
        if snap.time == self._last_time:
            return
        self._last_time = snap.time
        self.source = snap.source + (" (degraded: {})".format(snap.degraded) if snap.degraded else "")
        temps = [t for t in (snap.temperatures or {}).values() if t is not None]
        values = {"temperature_c": max(temps) if temps else None, "gpu_clock_mhz": _as_float(snap.gpu_freq_mhz),
                  "power_w": _as_float(snap.power_w)}
        self.samples.append((time.monotonic(), values))

    def stop(self) -> None:
        self._telemetry = None
        if self._own is not None:
            try:
                self._own.stop()
            except Exception as exc:  # a reader that fails to stop must not lose the report
                self.reason = self.reason or "stop failed: {}".format(exc)
            self._own = None

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


def _as_float(value: Any) -> Optional[float]:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def load_previous(path: str) -> Dict[str, Any]:
    data = load_json(path, "previous report")
    if not isinstance(data, dict) or not isinstance(data.get("stages_ms"), dict):
        raise EdgeError("{}: not an edge check report (no 'stages_ms')".format(path))
    if data.get("schema_version") != SCHEMA_VERSION:
        raise EdgeError("{}: schema_version {!r}, this edge check reads {}".format(
            path, data.get("schema_version"), SCHEMA_VERSION))
    return data


def _ms(value: Any) -> Optional[float]:
    """A report's milliseconds, or None for anything else (strings, NaN, a 400-digit number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        ms = float(value)
    except OverflowError:
        return None
    return ms if math.isfinite(ms) and 0 <= ms < 1e9 else None


def compare(current: Dict[str, Any], previous: Dict[str, Any], previous_path: str,
            pct: float = REGRESSION_PCT, ms: float = REGRESSION_MS) -> Dict[str, Any]:
    """Per-stage p50/p99 deltas; a regression is worse by more than `pct` percent AND more than `ms` ms."""
    stages: Dict[str, Any] = {}
    regressions = []
    for name, now in current.items():
        before = previous["stages_ms"].get(name)
        if not isinstance(before, dict):
            continue
        entry = {}
        for q in ("p50", "p99"):
            old, new = _ms(before.get(q)), _ms(now.get(q))
            if old is None or new is None:
                continue
            delta = new - old
            rel = 100.0 * delta / old if old > 0 else None
            worse = delta > ms and (rel is None or rel > pct)
            entry[q] = {"previous": old, "current": new, "delta_ms": round(delta, 3),
                        "delta_pct": None if rel is None else round(rel, 1), "regressed": worse}
            if worse:
                regressions.append("{} {} {:.3f} -> {:.3f} ms (+{:.3f} ms{})".format(
                    name, q, old, new, delta, "" if rel is None else ", +{:.1f}%".format(rel)))
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
