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
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import __version__
from .errors import EXIT_FAIL, EXIT_OK, EdgeError, require
from .latency import STAGES, format_table
from .log import JsonLog
from .modelinfo import UNTRAINED_WARNING, sha256_file
from .pipeline import Result, Sink

SCHEMA_VERSION = 1
FIGURE_SIZE_IN = (12.0, 9.0)
FIGURE_DPI = 100
FIGURE_PX = (int(FIGURE_SIZE_IN[0] * FIGURE_DPI), int(FIGURE_SIZE_IN[1] * FIGURE_DPI))  # (width, height)
REGRESSION_PCT = 10.0  # a stage's p50/p99 is flagged when it got worse by more than this many percent ...
REGRESSION_MS = 0.2  # ... and by more than this many milliseconds
DEFAULT_FRAMES = 1000
DEFAULT_WARMUP = 50
NOT_A_JETSON = "not a Jetson: clock state unknown"
NV_TEGRA_RELEASE = "etc/nv_tegra_release"  # relative to the root (tests pass a fake root)
STACKED = ("frame_age", "preprocess", "infer", "postprocess")  # end_to_end = their sum (plus timer gaps)
TELEMETRY_METRICS = (("temperature_c", "temperature (°C)"), ("gpu_clock_mhz", "GPU clock (MHz)"),
                     ("power_w", "power (W)"))

# JSON-Schema (draft-07 subset: type, properties, required, items, additionalProperties, enum) of the report.
_NUM = {"type": "number"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_STATS = {"type": "object", "required": ["p50", "p90", "p99", "max", "mean"],
          "properties": {k: _NUM for k in ("p50", "p90", "p99", "max", "mean")}}
_MINMEAN = {"type": ["object", "null"], "required": ["min", "mean", "max"],
            "properties": {"min": _NUM, "mean": _NUM, "max": _NUM}}
_DELTA = {"type": "object", "required": ["previous", "current", "delta_ms", "delta_pct", "regressed"],
          "properties": {"previous": _NUM, "current": _NUM, "delta_ms": _NUM, "delta_pct": {"type": ["number", "null"]},
                         "regressed": {"type": "boolean"}}}
SCHEMA: Dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "edge check report",
    "type": "object",
    "required": ["schema_version", "tool", "created", "verdict", "verdict_reason", "budget_ms", "frames",
                 "frames_requested", "warmup", "ended_by", "duration_s", "fps", "source", "backend", "precision",
                 "model", "stages_ms", "misses", "miss_rate", "errors", "skipped_frames", "warnings", "telemetry",
                 "system", "comparison", "figure"],
    "properties": {
        "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
        "tool": _STR,  # "edge check <version>"
        "created": _STR,  # UTC, ISO 8601
        "verdict": {"type": "string", "enum": ["pass", "fail"]},
        "verdict_reason": _STR,
        "budget_ms": _NUM,
        "frames": _INT,  # timed frames (after warm-up)
        "frames_requested": _INT,
        "warmup": _INT,
        "ended_by": {"type": "string", "enum": ["frames", "end of source"]},
        "duration_s": _NUM,  # wall time of the timed frames
        "fps": _NUM,  # timed frames / duration_s
        "source": _STR,
        "backend": _STR,  # onnxruntime | tensorrt
        "precision": _STR,  # fp32 | int8-qdq | fp16 | int8 ...
        "preprocess": _STR,
        "chosen_because": _STR,
        "model": {"type": "object", "required": ["path", "sha256", "weights", "trained"],
                  "properties": {"path": _STR, "sha256": {"type": ["string", "null"]},
                                 "weights": {"type": ["string", "null"]}, "trained": {"type": "boolean"},
                                 "warning": {"type": ["string", "null"]}}},
        "stages_ms": {"type": "object", "required": list(STAGES), "additionalProperties": _STATS},
        "misses": _INT,
        "miss_rate": _NUM,
        "errors": _INT,  # frames that raised (not timed)
        "skipped_frames": _INT,  # frames the source produced that the pipeline never saw
        "warnings": {"type": "array", "items": _STR},
        "telemetry": {
            "type": "object", "required": ["status", "reason", "samples"] + [m for m, _ in TELEMETRY_METRICS],
            "properties": dict({"status": {"type": "string", "enum": ["ok", "unavailable"]},
                                "reason": {"type": ["string", "null"]}, "samples": _INT, "source": _STR},
                               **{m: _MINMEAN for m, _ in TELEMETRY_METRICS}),
        },
        "system": {
            "type": "object",
            "required": ["hostname", "platform", "machine", "python", "cpu_count", "onnxruntime", "tensorrt",
                         "opencv", "l4t", "jetson", "nvpmodel", "nvpmodel_max", "jetson_clocks"],
            "properties": {
                "hostname": _STR, "platform": _STR, "machine": _STR, "python": _STR, "cpu_count": _INT,
                "onnxruntime": {"type": ["string", "null"]}, "tensorrt": {"type": ["string", "null"]},
                "opencv": {"type": ["string", "null"]}, "l4t": {"type": ["string", "null"]},
                "board": {"type": ["string", "null"]}, "jetson": {"type": "boolean"},
                "nvpmodel": {"type": ["string", "null"]}, "nvpmodel_max": {"type": ["boolean", "null"]},
                "jetson_clocks": {"type": "string", "enum": ["on", "off", "unknown"]},
            },
        },
        "comparison": {
            "type": ["object", "null"], "required": ["previous", "thresholds", "stages", "regressions"],
            "properties": {
                "previous": _STR,
                "thresholds": {"type": "object", "required": ["pct", "ms"], "properties": {"pct": _NUM, "ms": _NUM}},
                "stages": {"type": "object", "additionalProperties": {
                    "type": "object", "required": ["p50", "p99"], "properties": {"p50": _DELTA, "p99": _DELTA}}},
                "regressions": {"type": "array", "items": _STR},
            },
        },
        "figure": {"type": ["object", "null"], "required": ["path", "width_px", "height_px"],
                   "properties": {"path": _STR, "width_px": _INT, "height_px": _INT}},
    },
}

_TYPES: Dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def schema_errors(value: Any, schema: Dict[str, Any] = SCHEMA, where: str = "report") -> List[str]:
    """Everything in `value` that does not match `schema` (the subset of JSON Schema SCHEMA uses)."""
    errors: List[str] = []
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_TYPES[t](value) for t in types):
            return ["{}: expected {}, got {!r}".format(where, "|".join(types), value)]
    if "enum" in schema and value not in schema["enum"]:
        errors.append("{}: {!r} not one of {}".format(where, value, schema["enum"]))
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append("{}: missing '{}'".format(where, key))
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors.extend(schema_errors(item, sub, "{}.{}".format(where, key)))
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], "{}[{}]".format(where, i)))
    return errors


# --- per-frame series --------------------------------------------------------------------------------------

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


# --- clocks, system, telemetry -----------------------------------------------------------------------------

def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            return fh.read(65536).strip()
    except OSError:
        return None


def _nvpmodel(root: str, timeout_s: float = 5.0) -> Tuple[Optional[str], Optional[int], Optional[bool], str]:
    """(mode name, mode id, at max?, problem) from `nvpmodel -q` and the modes in /etc/nvpmodel.conf."""
    try:
        proc = subprocess.run(["nvpmodel", "-q"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, None, None, "nvpmodel -q failed ({})".format(type(exc).__name__)
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("NV Power Mode")), None)
    mode_id = next((int(ln) for ln in lines if ln.isdigit()), None)
    if name is None:
        return None, None, None, "nvpmodel -q said nothing usable"
    conf = _read(os.path.join(root, "etc/nvpmodel.conf")) or ""
    modes = {int(i): n for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)", conf)}
    maxn = [i for i, n in modes.items() if "MAXN" in n.upper()]
    if maxn:  # MAXN / MAXN_SUPER: the unconstrained mode where the board has one
        at_max = mode_id in maxn if mode_id is not None else "MAXN" in name.upper()
    elif modes:
        at_max = mode_id == min(modes)  # by convention mode 0 is the highest-power one
    else:
        at_max = "MAXN" in name.upper() or None
    return name, mode_id, at_max, ""


def _min_eq_max(folder: str, lo: str, hi: str) -> Optional[bool]:
    a, b = _read(os.path.join(folder, lo)), _read(os.path.join(folder, hi))
    if a is None or b is None or not a.isdigit() or not b.isdigit():
        return None
    return int(a) == int(b)


def jetson_clocks_state(root: str = "/") -> str:
    """'on' when every online CPU and the GPU run with min = max frequency (what jetson_clocks sets), else
    'off'; 'unknown' when sysfs does not say."""
    cpus = []
    cpu_root = os.path.join(root, "sys/devices/system/cpu")
    for name in sorted(os.listdir(cpu_root)) if os.path.isdir(cpu_root) else []:
        freq = os.path.join(cpu_root, name, "cpufreq")
        if name[3:].isdigit() and name.startswith("cpu") and os.path.isdir(freq):
            if _read(os.path.join(cpu_root, name, "online")) == "0":
                continue
            cpus.append(_min_eq_max(freq, "scaling_min_freq", "scaling_max_freq"))
    gpus = []
    devfreq = os.path.join(root, "sys/class/devfreq")
    for name in sorted(os.listdir(devfreq)) if os.path.isdir(devfreq) else []:
        if any(k in name for k in ("gpu", "ga10b", "gv11b", "gp10b", "gk20a", "gb10b")):
            gpus.append(_min_eq_max(os.path.join(devfreq, name), "min_freq", "max_freq"))
    states = cpus + gpus
    if not gpus or not cpus or any(s is None for s in states):
        return "unknown"
    return "on" if all(states) else "off"


def clock_state(root: str = "/") -> Tuple[Dict[str, Any], List[str]]:
    """({jetson, l4t, board, nvpmodel, nvpmodel_max, jetson_clocks}, warnings about DVFS)."""
    from .artifacts import read_l4t

    release = os.path.join(root, NV_TEGRA_RELEASE)
    if not os.path.isfile(release):
        return {"jetson": False, "l4t": None, "board": None, "nvpmodel": None, "nvpmodel_max": None,
                "jetson_clocks": "unknown"}, [NOT_A_JETSON]
    board = _read(os.path.join(root, "proc/device-tree/model"))
    state: Dict[str, Any] = {"jetson": True, "l4t": read_l4t(release), "board": board.rstrip("\x00") if board else None}
    warnings = []
    name, mode_id, at_max, problem = _nvpmodel(root)
    state["nvpmodel"] = None if name is None else "{} ({})".format(name, mode_id) if mode_id is not None else name
    state["nvpmodel_max"] = at_max
    if problem:
        warnings.append("nvpmodel: {}: power mode unknown".format(problem))
    elif at_max is False:
        warnings.append("nvpmodel is '{}', not the maximum power mode: timings reflect capped clocks "
                        "(sudo nvpmodel -m <max id>)".format(name))
    clocks = jetson_clocks_state(root)
    state["jetson_clocks"] = clocks
    if clocks == "off":
        warnings.append("jetson_clocks is off: DVFS makes timings noisy (sudo jetson_clocks)")
    elif clocks == "unknown":
        warnings.append("jetson_clocks state unknown (no cpufreq/devfreq min/max in sysfs)")
    return state, warnings


def _with_jtop_clocks(clocks: Dict[str, Any], warnings: List[str], snap: Any) -> Tuple[Dict[str, Any], List[str]]:
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


def _version(module: str) -> Optional[str]:
    try:
        return str(__import__(module).__version__)
    except Exception:  # absent or broken optional package: reported as null
        return None


def system_info(clocks: Dict[str, Any]) -> Dict[str, Any]:
    from .artifacts import tensorrt_version

    info = {
        "hostname": socket.gethostname(), "platform": platform.platform(), "machine": platform.machine(),
        "python": platform.python_version(), "cpu_count": os.cpu_count() or 0,
        "onnxruntime": _version("onnxruntime"), "tensorrt": tensorrt_version(), "opencv": _version("cv2"),
    }
    info.update(clocks)
    return info


class TelemetryTrace:
    """Telemetry samples (temperature, GPU clock, power) during the timed frames; unavailable with a reason.

    Reads edge.telemetry's side thread (jtop on a Jetson, /sys elsewhere): `poll()` is an attribute read,
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
                from .telemetry import Telemetry

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


# --- comparison --------------------------------------------------------------------------------------------

def load_previous(path: str) -> Dict[str, Any]:
    try:
        with open(path, "r", encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise EdgeError("{}: cannot read previous report: {}".format(path, exc.strerror)) from None
    except ValueError as exc:
        raise EdgeError("{}: previous report is not JSON: {}".format(path, exc)) from None
    if not isinstance(data, dict) or not isinstance(data.get("stages_ms"), dict):
        raise EdgeError("{}: not an edge check report (no 'stages_ms')".format(path))
    if data.get("schema_version") != SCHEMA_VERSION:
        raise EdgeError("{}: schema_version {!r}, this edge check reads {}".format(
            path, data.get("schema_version"), SCHEMA_VERSION))
    return data


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
            old, new = before.get(q), now.get(q)
            if not isinstance(old, (int, float)) or not isinstance(new, (int, float)):
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


# --- figure ------------------------------------------------------------------------------------------------

def plot(path: str, report: Dict[str, Any], series: SeriesSink, telemetry: List[Tuple[float, Dict[str, Any]]],
         t0: float) -> Dict[str, Any]:
    """Histogram with the budget line, per-frame stacked stages, telemetry traces: FIGURE_PX pixels, PNG."""
    require("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    budget = report["budget_ms"]
    e2e = series.series("end_to_end")
    e2e = e2e[np.isfinite(e2e)]
    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(3, 3, height_ratios=(1.0, 1.2, 0.75), left=0.06, right=0.98, top=0.9, bottom=0.06,
                            hspace=0.45, wspace=0.25)
    verdict = report["verdict"].upper()
    title = "edge check: {} - p99 end_to_end {:.2f} ms, budget {:g} ms - {} {} - {} frames, {}".format(
        verdict, report["stages_ms"]["end_to_end"]["p99"], budget, report["backend"], report["precision"],
        report["frames"], report["system"]["hostname"])
    fig.suptitle(title, fontsize=12, color="#1a7f37" if verdict == "PASS" else "#cf222e", y=0.985)
    subtitle = "; ".join(([report["model"]["warning"]] if report["model"].get("warning") else [])
                         + report["warnings"])
    if subtitle:
        fig.text(0.5, 0.935, subtitle[:180], ha="center", fontsize=9, color="#9a6700")

    ax = fig.add_subplot(grid[0, :])
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

    ax = fig.add_subplot(grid[1, :])
    x = np.arange(1, series.count + 1)
    stacks = [np.nan_to_num(series.series(s)) for s in STACKED]
    ax.stackplot(x, *stacks, labels=STACKED, colors=("#c8c8c8", "#dd8452", "#4c72b0", "#55a868"), linewidth=0)
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

    tele = report["telemetry"]
    for col, (metric, label) in enumerate(TELEMETRY_METRICS):
        ax = fig.add_subplot(grid[2, col])
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
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=FIGURE_DPI, format="png")
    return {"path": path, "width_px": FIGURE_PX[0], "height_px": FIGURE_PX[1]}


def _wrap(text: str, width: int) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = (line + " " + w).strip()
    return "\n".join(lines + [line])


# --- the check ---------------------------------------------------------------------------------------------

class _Events(JsonLog):
    """The runtime's log events, kept (not printed): the check prints its own table."""

    def __init__(self) -> None:
        super().__init__(stream=io.StringIO())
        self.events: List[Dict[str, Any]] = []

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        self.events.append(dict(fields, event=event, level=level))


def _sha256(path: str) -> Optional[str]:
    try:
        return sha256_file(path)
    except OSError:
        return None


def _writable_parent(path: str, what: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    probe = parent
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK):
        raise EdgeError("{}: cannot write the {} ({} is not writable)".format(path, what, probe))


def run_check(cfg: Any, frames: int, json_path: Optional[str] = None, plot_path: Optional[str] = None,
              previous: Optional[str] = None, regression_pct: float = REGRESSION_PCT,
              regression_ms: float = REGRESSION_MS, clock_root: str = "/",
              out: Callable[[str], None] = print, warn: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run the check with config `cfg` (its runtime.warmup and runtime.budget_ms apply); returns the report.

    Input problems raise EdgeError (exit 2) before any frame is timed. The verdict is in report['verdict'].
    """
    from .runtime import Runtime
    from .sources import SourceEnded, SourceTimeout

    if frames < 1:
        raise EdgeError("--frames must be >= 1, got {}".format(frames))
    prev = load_previous(previous) if previous else None
    for path, what in ((json_path, "JSON report"), (plot_path, "figure")):
        if path:
            _writable_parent(path, what)
    if plot_path:
        require("matplotlib")
    cfg.runtime.latency_window = max(cfg.runtime.latency_window, frames)  # percentiles exact over the whole run
    cfg.service.telemetry.interval_s = min(cfg.service.telemetry.interval_s, 0.5)  # a few samples per second
    cfg.service.metrics.enabled = False  # the service may be running with the same config and hold the port
    clocks, warnings = clock_state(clock_root)
    telemetry = TelemetryTrace(cfg.service.telemetry.interval_s, cfg.service.telemetry.enabled)
    series = SeriesSink(frames, telemetry.poll)
    events = _Events()
    runtime = Runtime(cfg, events, [series])
    ended_by = "frames"
    try:
        try:
            pipeline = runtime.start()
        except EdgeError:
            raise
        except Exception as exc:  # a backend or source failing in its own way: still one line, exit 2
            raise EdgeError("cannot start the pipeline: {}: {}".format(type(exc).__name__, exc)) from None
        telemetry.start(runtime)
        clocks, warnings = _with_jtop_clocks(clocks, warnings, telemetry.first)
        t0 = time.monotonic()
        try:
            runtime.warm_up()
            t0 = time.monotonic()
            while pipeline.recorder.frames < frames:
                pipeline.step()
        except SourceEnded:
            ended_by = "end of source"
        except SourceTimeout as exc:
            raise EdgeError("source: {}".format(exc)) from None
        except Exception as exc:
            if isinstance(exc, EdgeError):
                raise
            name = type(exc).__name__
            raise EdgeError("the pipeline failed: {}: {}".format(name, exc)) from None
        t1 = time.monotonic()
        telemetry.stop()
        if pipeline.recorder.frames == 0:
            raise EdgeError("{}: the source ended before any timed frame (warm-up {} frames); use a longer clip "
                            "or source.loop: true".format(cfg.source.uri, cfg.runtime.warmup))
        summary = runtime.report()
        describe = runtime.backend.describe()
    finally:
        telemetry.stop()
        runtime.close()

    start = next((e for e in events.events if e["event"] == "start"), {})
    stages = summary["stages_ms"]
    p99 = stages["end_to_end"]["p99"]
    budget = cfg.runtime.budget_ms
    passed = p99 <= budget
    if ended_by != "frames":
        warnings.append("source ended after {} of {} frames".format(summary["frames"], frames))
    report: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": "edge check " + __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verdict": "pass" if passed else "fail",
        "verdict_reason": "p99 end_to_end {:.3f} ms {} budget {:g} ms".format(p99, "<=" if passed else ">", budget),
        "budget_ms": budget,
        "frames": summary["frames"],
        "frames_requested": frames,
        "warmup": cfg.runtime.warmup,
        "ended_by": ended_by,
        "duration_s": round(t1 - t0, 3),
        "fps": round(summary["frames"] / (t1 - t0), 2) if t1 > t0 else 0.0,
        "source": str(start.get("source", cfg.source.uri)),
        "backend": str(describe.get("backend", "?")),
        "precision": str(describe.get("precision", "?")),
        "preprocess": str(start.get("preprocess", "?")),
        "chosen_because": str(start.get("chosen_because", "")),
        "model": {"path": cfg.model.path, "sha256": _sha256(cfg.model.path),
                  "weights": None if runtime.model_info.get("weights") is None else str(runtime.model_info["weights"]),
                  "trained": runtime.trained, "warning": None if runtime.trained else UNTRAINED_WARNING},
        "stages_ms": stages,
        "misses": summary["misses"],
        "miss_rate": summary["miss_rate"],
        "errors": summary.get("errors", 0),
        "skipped_frames": summary.get("skipped", 0),
        "warnings": warnings,
        "telemetry": telemetry.summary(),
        "system": system_info(clocks),
        "comparison": compare(stages, prev, previous or "", regression_pct, regression_ms) if prev else None,
        "figure": None,
    }
    if plot_path:
        report["figure"] = plot(plot_path, report, series, telemetry.samples, t0)
    if json_path:
        from .modelinfo import write_json_atomic

        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        write_json_atomic(json_path, report)
    for line in warnings:
        warn("warning: " + line)
    out(format_report(report))
    return report


def format_report(report: Dict[str, Any]) -> str:
    """The trtexec-like table (edge.latency.format_table) with a header, the verdict and any comparison."""
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
    from .cli import add_config_flags

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


def add_check_parser(subparsers: Any) -> argparse.ArgumentParser:
    from .cli import add_command

    return add_command(subparsers, "check", "latency check: N frames through the pipeline against the budget",
                       __doc__, add_arguments, cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from .cli import config_from_args

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
    from .cli import standalone_main

    return standalone_main(prog, __doc__, add_arguments, cmd_check, argv)


if __name__ == "__main__":
    sys.exit(main())
