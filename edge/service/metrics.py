"""Prometheus metrics for `edge run`: a pipeline Sink plus a small HTTP endpoint on 127.0.0.1.

  GET /healthz   200 "ok ..." when a frame completed (ok or miss) within `stale_after_s` (default 10 s, the
                 systemd WatchdogSec), "degraded: <why>; ok ..." while serving degraded (stand-in stages,
                 overloaded cameras), else 503 with a one-line reason: the Kubernetes liveness/readiness probe
  GET /metrics   (or any other path) the exposition below

Everything lives in the sink's own CollectorRegistry (not prometheus_client's global one), so several
runtimes or tests can coexist in one process. Names follow the Prometheus conventions: `edge_` prefix,
base units (seconds, hertz, watts, ratios 0-1), `_total` on counters, the stage as a label.

  edge_stage_duration_seconds{stage}     histogram  capture, frame_age, preprocess, infer, postprocess
  edge_frame_latency_seconds             histogram  capture -> result (the budgeted latency)
  edge_frames_total{status}              counter    ok | miss | error
  edge_deadline_misses_total             counter    frames over runtime.budget_ms
  edge_budget_seconds                    gauge      runtime.budget_ms
  edge_dropped_frames_total              counter    frames the reader overwrote before the loop took them
  edge_source_faults_total               counter    live-source read errors, lost streams, broken streaks, hangs
  edge_source_reconnects_total           counter    successful source reopenings
  edge_source_broken_frames_total        counter    images rejected as broken
  edge_reloads_total{result}             counter    SIGHUP reloads: ok | failed
  edge_class_frames_total{class}         counter    timed frames by top-1 class: the first MAX_CLASS_SERIES classes
                                                    seen (in a steady scene, the frequent ones) each, then "other"
  edge_camera_frame_latency_seconds{camera}  histogram  several cameras (config sources): each one's end to end
  edge_camera_frames_total{camera,status}    counter    ... its frames: ok | miss | error
  edge_camera_dropped_frames_total{camera,reason}  counter  ... superseded (a newer frame came) | expired (could
                                                           no longer make its deadline)
  edge_frame_batch_size                  histogram  several cameras: the size of the batch each frame was served in
  edge_gpu_load_ratio, edge_cpu_load_ratio, edge_ram_used_ratio, edge_power_watts,
  edge_temperature_celsius{zone}, edge_cpu_frequency_hertz, edge_gpu_frequency_hertz, edge_emc_frequency_hertz,
  edge_jetson_clocks_enabled, edge_nvpmodel_info{mode}, edge_telemetry_degraded, edge_telemetry_age_seconds,
  edge_telemetry_source_info{source}    gauges read from the latest telemetry snapshot at scrape time
  edge_degraded                          1 while serving degraded (/healthz says why)
  edge_cpu_frequency_max_hertz, edge_gpu_frequency_max_hertz   clock ceilings (throttling lowers them)
  edge_power_rail_overcurrent{rail}      1 when a rail's current is at its warning limit (jtop only)
  edge_build_info{version,python,release,board,l4t,tensorrt}, edge_engine_info{backend,precision,model,sha256}
  process_resident_memory_bytes, process_cpu_seconds_total, ...   prometheus_client's process collector

The `camera` label takes the names in config `sources` only (at most edge.config.MAX_CAMERAS), the `class` label
at most MAX_CLASS_SERIES labels and "other": bounded, whatever the model.
Histogram buckets are derived from the budget and dense around it, with one bucket exactly at the budget
so `edge_frame_latency_seconds_bucket{le="<budget>"}` answers "what fraction met the deadline".
"""

import os
import platform
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from edge import __version__
from edge.board import board_model, read_l4t, tensorrt_probe
from edge.errors import EdgeError, require
from edge.infer.latency import STAGES as LATENCY_STAGES
from edge.infer.pipeline import Result
from edge.service.http import BoundedThreadingMixIn, DeadlineRequestHandler, allowed_hosts
from edge.service.parts import ServicePart

STAGES = LATENCY_STAGES[:-1]  # end_to_end has a histogram of its own
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)
STATUSES = ("ok", "miss", "error")
MAX_SCRAPERS = 8  # connections served at once (Prometheus, a probe, a person); more are answered 503
SCRAPE_TIMEOUT_S = 10.0
MAX_CLASS_SERIES = 10  # classes with a series of their own; a 1000-class model's others count as "other"
OTHER_CLASS = "other"
HEALTHZ_STALE_S = 10.0  # no completed frame for longer: /healthz fails (the unit's WatchdogSec; covers a reload)
# Multiples of the budget: fine below and around it, a few coarse ones for the tail.
BUDGET_FACTORS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25,
                  1.5, 2.0, 3.0, 5.0, 10.0)


# Stages far below the budget (postprocess, capture: tenths of a millisecond) need their own fine buckets.
STAGE_FINE_S = (0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002)


def stage_buckets(budget_ms: float) -> List[float]:
    """The budget's buckets plus fine ones down to 20 us, for the per-stage histogram."""
    return sorted(set(budget_buckets(budget_ms)) | set(STAGE_FINE_S))


def budget_buckets(budget_ms: float) -> List[float]:
    """Histogram upper bounds in seconds for a budget in ms (one is the budget itself)."""
    budget_s = budget_ms / 1000.0
    return sorted({round(budget_s * f, 7) for f in BUDGET_FACTORS})


class _StateCollector:
    """Counters and gauges read at scrape time from the source and the telemetry thread (nothing in the loop)."""

    def __init__(self, source_stats: Callable[[], Dict[str, int]], telemetry: Callable[[], Any]):
        self.source_stats = source_stats
        self.telemetry = telemetry

    def describe(self) -> List[Any]:
        return []  # keeps registration from calling collect()

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = _safe_call(self.source_stats) or {}
        for name, key, doc in (
                ("edge_dropped_frames", "skipped", "Frames the reader overwrote before the pipeline took them"),
                ("edge_source_faults", "faults", "Live-source faults: read errors, lost streams, broken images, hangs"),
                ("edge_source_reconnects", "reconnects", "Successful source reopenings after a fault"),
                ("edge_source_broken_frames", "broken", "Images rejected as broken (empty, wrong shape or type)")):
            yield CounterMetricFamily(name, doc, value=float(stats.get(key, 0)))
        snap = _safe_call(self.telemetry)
        if snap is None:
            return
        for name, attr, scale, doc in (
                ("edge_gpu_load_ratio", "gpu_load", 1.0, "GPU load, 0-1"),
                ("edge_cpu_load_ratio", "cpu_load", 1.0, "CPU load averaged over online cores, 0-1"),
                ("edge_ram_used_ratio", "ram_fraction", 1.0, "RAM used / total, 0-1"),
                ("edge_power_watts", "power_w", 1.0, "Total board power"),
                ("edge_cpu_frequency_hertz", "cpu_freq_mhz", 1e6, "Mean current CPU core frequency"),
                ("edge_gpu_frequency_hertz", "gpu_freq_mhz", 1e6, "Current GPU frequency"),
                ("edge_cpu_frequency_max_hertz", "cpu_freq_max_mhz", 1e6, "Mean CPU core frequency ceiling"),
                ("edge_gpu_frequency_max_hertz", "gpu_freq_max_mhz", 1e6, "GPU frequency ceiling"),
                ("edge_emc_frequency_hertz", "emc_freq_mhz", 1e6, "Current memory controller (EMC) frequency")):
            value = getattr(snap, attr, None)
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=float(value) * scale)
        if snap.temperatures:
            temps = GaugeMetricFamily("edge_temperature_celsius", "Temperature by thermal zone", labels=["zone"])
            for zone, value in sorted(snap.temperatures.items()):
                temps.add_metric([zone], float(value))
            yield temps
        if snap.overcurrent:
            rails = GaugeMetricFamily("edge_power_rail_overcurrent",
                                      "1 when the rail's current is at its warning limit (throttling)", labels=["rail"])
            for rail, over in sorted(snap.overcurrent.items()):
                rails.add_metric([rail], 1.0 if over else 0.0)
            yield rails
        if snap.jetson_clocks is not None:
            yield GaugeMetricFamily("edge_jetson_clocks_enabled", "1 when jetson_clocks pins the clocks at max",
                                    value=1.0 if snap.jetson_clocks else 0.0)
        if snap.nvpmodel is not None:
            mode = GaugeMetricFamily("edge_nvpmodel_info", "Active nvpmodel power mode", labels=["mode"])
            mode.add_metric([snap.nvpmodel], 1.0)
            yield mode
        yield GaugeMetricFamily("edge_telemetry_degraded", "1 when telemetry falls back from jtop (see the log)",
                                value=1.0 if snap.degraded else 0.0)
        yield GaugeMetricFamily("edge_telemetry_age_seconds", "Age of the latest telemetry sample",
                                value=max(0.0, time.time() - snap.time))
        source = GaugeMetricFamily("edge_telemetry_source_info", "Where telemetry comes from", labels=["source"])
        source.add_metric([snap.source], 1.0)
        yield source


class _CameraDrops:
    """edge_camera_dropped_frames_total{camera,reason}, read at scrape time from the cameras' counters."""

    def __init__(self, camera_stats: Callable[[], Dict[str, Dict[str, int]]]):
        self.camera_stats = camera_stats

    def describe(self) -> List[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        drops = CounterMetricFamily("edge_camera_dropped_frames", "Frames a camera gave that were never served: "
                                    "superseded by its newer frame, or expired (could no longer make the deadline)",
                                    labels=["camera", "reason"])
        for camera, stats in sorted((_safe_call(self.camera_stats) or {}).items()):
            for reason in ("superseded", "expired"):
                drops.add_metric([camera, reason], float(stats.get(reason, 0)))
        yield drops


def _safe_call(fn: Optional[Callable[[], Any]]) -> Any:
    if fn is None:
        return None
    try:
        return fn()
    except Exception:  # a scrape must not fail because one source of values did
        return None


class _QuietHandler(DeadlineRequestHandler, WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_S  # a scraper that stops reading the answer


class _ThreadingServer(BoundedThreadingMixIn, WSGIServer):
    """A flood of (half-open) connections costs at most MAX_SCRAPERS threads; the frame loop keeps its CPU."""

    max_clients = MAX_SCRAPERS
    name = "edge metrics"
    allow_reuse_address = True
    request_queue_size = 64


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def build_labels() -> Dict[str, str]:
    """edge_build_info's labels: the package, the release deploy/ansible or the chart set (EDGE_RELEASE) and what
    the engine is tied to, so dashboards and alerts can group devices by them ("" when unknown)."""
    return {"version": __version__, "python": platform.python_version(),
            "release": os.environ.get("EDGE_RELEASE", ""), "board": board_model() or "",
            "l4t": read_l4t() or "", "tensorrt": tensorrt_probe().version or ""}


class MetricsSink(ServicePart):
    """Observes every delivered Result; `serve()` exposes the registry and /healthz over HTTP."""

    def __init__(self, budget_ms: float, registry: Any = None,
                 source_stats: Optional[Callable[[], Dict[str, int]]] = None,
                 telemetry: Optional[Callable[[], Any]] = None, stale_after_s: float = HEALTHZ_STALE_S,
                 camera_stats: Optional[Callable[[], Dict[str, Dict[str, int]]]] = None,
                 degraded: Callable[[], Optional[str]] = lambda: None):
        prom = require("prometheus_client")
        if hasattr(prom, "disable_created_metrics"):  # prometheus-client >= 0.17
            prom.disable_created_metrics()  # no `_created` series: 22 per device that nothing reads
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.stale_after_s = stale_after_s
        self.degraded = degraded  # why the service runs degraded now (stand-in stages, overloaded cameras), or None
        self.last_frame: Optional[float] = None  # time.monotonic() of the latest completed frame
        buckets = budget_buckets(budget_ms)
        self.stage_hist = prom.Histogram("edge_stage_duration_seconds", "Time per pipeline stage", ["stage"],
                                         buckets=stage_buckets(budget_ms), registry=self.registry)
        self.latency_hist = prom.Histogram("edge_frame_latency_seconds",
                                           "Capture to result (end to end), the budgeted latency",
                                           buckets=buckets, registry=self.registry)
        self.frames = prom.Counter("edge_frames", "Frames processed, by status", ["status"], registry=self.registry)
        self.misses = prom.Counter("edge_deadline_misses", "Frames over the latency budget", registry=self.registry)
        self.reloads = prom.Counter("edge_reloads", "SIGHUP reloads, by result", ["result"], registry=self.registry)
        self.class_frames = prom.Counter("edge_class_frames", "Timed frames by top-1 class (the first {} classes "
                                         "seen, then other)".format(MAX_CLASS_SERIES), ["class"],
                                         registry=self.registry)
        self._classes: Dict[str, Any] = {}  # label -> its series, at most MAX_CLASS_SERIES
        budget = prom.Gauge("edge_budget_seconds", "The end-to-end latency budget", registry=self.registry)
        budget.set(budget_ms / 1000.0)
        prom.Gauge("edge_degraded", "1 while the service runs degraded (/healthz and the log say why)",
                   registry=self.registry).set_function(lambda: 1.0 if self.degraded() else 0.0)
        self.build = prom.Info("edge_build", "jetson-edge build, the deployed release and the board",
                               registry=self.registry)
        self.build.info(build_labels())
        self.engine = prom.Info("edge_engine", "The backend serving now", registry=self.registry)
        self._stages = {name: self.stage_hist.labels(name) for name in STAGES}  # present (at 0) from the start
        self._status = {name: self.frames.labels(name) for name in STATUSES}
        for result in ("ok", "failed"):
            self.reloads.labels(result)
        self.registry.register(_StateCollector(source_stats or dict, telemetry or (lambda: None)))
        self.camera_latency = prom.Histogram("edge_camera_frame_latency_seconds", "Capture to result, by camera",
                                             ["camera"], buckets=buckets, registry=self.registry)
        self.camera_frames = prom.Counter("edge_camera_frames", "Frames processed, by camera and status",
                                          ["camera", "status"], registry=self.registry)
        self.batch_size = prom.Histogram("edge_frame_batch_size", "Size of the batch each frame was served in",
                                         buckets=BATCH_BUCKETS, registry=self.registry)
        if camera_stats is not None:
            self.registry.register(_CameraDrops(camera_stats))
        try:
            prom.ProcessCollector(registry=self.registry)  # process_resident_memory_bytes: the memory-growth alert
        except ValueError:
            pass  # a shared registry (prometheus_client's global one) has it already
        self.server: Optional[WSGIServer] = None
        self._thread: Optional[threading.Thread] = None

    def serving(self, stages: Any) -> None:
        # the file's name only: a label carries no path of this machine (the sha256 identifies the bytes)
        d = stages.description
        self.engine.info({"backend": str(d.get("backend", "?")), "precision": str(d.get("precision", "?")),
                          "model": os.path.basename(str(stages.model_path)), "sha256": str(stages.sha256)})

    def reload_done(self, outcome: str) -> None:
        self.reloads.labels(outcome).inc()

    def on_result(self, result: Result) -> None:
        self._status[result.status].inc()
        if result.camera:
            self.camera_frames.labels(result.camera, result.status).inc()
        if result.status == "error":
            return
        if result.camera:
            self.camera_latency.labels(result.camera).observe(result.stage_ms["end_to_end"] / 1000.0)
            self.batch_size.observe(result.batch)
        self.last_frame = time.monotonic()
        stage_ms = result.stage_ms
        for name, child in self._stages.items():
            ms = stage_ms.get(name)
            if ms is not None:
                child.observe(ms / 1000.0)
        self.latency_hist.observe(stage_ms["end_to_end"] / 1000.0)
        if result.status == "miss":
            self.misses.inc()
        if result.prediction is not None:
            self._class_series(result.prediction.labels[0]).inc()

    def _class_series(self, label: str) -> Any:
        series = self._classes.get(label)
        if series is None:
            if len(self._classes) >= MAX_CLASS_SERIES:
                return self.class_frames.labels(OTHER_CLASS)
            series = self._classes[label] = self.class_frames.labels(label)
        return series

    def health(self) -> Tuple[bool, str]:
        """(healthy, one line) for /healthz."""
        if self.last_frame is None:
            return False, "no frame completed yet"
        age = time.monotonic() - self.last_frame
        if age > self.stale_after_s:
            return False, "no frame completed for {:.1f} s (limit {:g} s)".format(age, self.stale_after_s)
        degraded = self.degraded()
        line = "ok: last frame {:.2f} s ago".format(age)
        return True, "degraded: {}; {}".format(degraded, line) if degraded else line

    def _app(self, metrics_app: Callable[..., Any]) -> Callable[..., Any]:
        def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Any:
            if environ.get("PATH_INFO") != "/healthz":
                return metrics_app(environ, start_response)
            healthy, line = self.health()
            body = (line + "\n").encode()
            start_response("200 OK" if healthy else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
            return [body]
        return app

    def serve(self, host: str = "127.0.0.1", port: int = 9108) -> int:
        """Start the HTTP endpoint (GET /healthz; GET /metrics or any other path); returns the bound port (port 0:
        a free one)."""
        prom = require("prometheus_client")
        app = self._app(prom.make_wsgi_app(self.registry))
        server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
        try:
            self.server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
            self.server.allowed_hosts = allowed_hosts(host)  # type: ignore[attr-defined]
        except OSError as exc:
            raise EdgeError("service.metrics: cannot listen on {}:{}: {}".format(
                host, port, exc.strerror or exc)) from None
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="edge-metrics", daemon=True)
        self._thread.start()
        return int(self.server.server_address[1])

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
