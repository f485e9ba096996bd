"""`edge run`: the runtime loop from a config, as a foreground command or a systemd service.

What it writes (JSON lines on stdout; under systemd journald takes the `<N>` priority prefix JsonLog adds):
  start                 once: backend, model, source, preprocess, budget, metrics address, telemetry source
  frame_miss (warning)  a frame over the budget: frame id, stage times, the stage that overran most against its
                        recent p50, the latest telemetry snapshot (temperatures, clocks, power, nvpmodel)
  frame_error (warning) a frame whose preprocess/infer/postprocess raised: frame id, error type and message
  summary               every `runtime.report_every` frames: percentiles, misses, errors, source and telemetry
  source_* (warning)    a live source fault, reconnect attempt and recovery; source_timeout when no frame came
  telemetry_*           jtop degraded / recovered (with the reason)
  reload*               SIGHUP: which model now serves, or why the old one kept serving
  report                last: the final report (also printed as a table on stderr)
Frames that meet the budget are not logged one by one: at 30 fps that would flood the journal; they are in
the summaries and the Prometheus histograms. Misses and errors are logged each, up to `MAX_FRAME_LINES_PER_S`
per second; beyond that they are counted (`suppressed`) and still in the metrics.

Signals: SIGTERM/SIGINT finish the frame in hand, log the report and return (exit 0); SIGHUP reloads the config
and swaps to the model it names without stopping (the old backend keeps serving if the new one fails).
More than `runtime.max_consecutive_errors` failed frames in a row raise EdgeError (exit 1, one line), so
systemd's Restart=on-failure restarts the service.
"""

import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .config import Config, SourceConfig, labels_path, load_config
from .errors import EXIT_FAIL, EdgeError
from .factory import create_stages
from .latency import LatencyRecorder, format_table
from .log import JsonLog
from .modelinfo import UNTRAINED_WARNING, read_model_info, sha256_file
from .notify import Notifier, NotifySink
from .pipeline import Pipeline, Result, Sink, TooManyErrors
from .postprocess import TopK, load_labels
from .sources import Capture, Frame, LatestFrameGrabber, SourceEnded, SourceTimeout, open_capture

MAX_FRAME_LINES_PER_S = 10  # frame_miss + frame_error lines per second before they are only counted
CULPRIT_STAGES = ("frame_age", "preprocess", "infer", "postprocess")  # the parts of end_to_end
P50_REFRESH_FRAMES = 64  # recompute the per-stage p50 used to name a miss's culprit this often


class StopFlag:
    """SIGINT/SIGTERM set `event` (the loop finishes the frame in hand, then reports and exits 0);
    SIGHUP sets `reload` (the loop reloads the config and model between two frames)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reload = threading.Event()
        self.signal: Optional[int] = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._handle)
            signal.signal(signal.SIGHUP, self._hangup)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signal = signum
        self.event.set()

    def _hangup(self, _signum: int, _frame: Any) -> None:
        self.reload.set()


class _RateLimit:
    """At most `per_s` events a second; counts what it holds back."""

    def __init__(self, per_s: int):
        self.per_s = per_s
        self.window_start = 0.0
        self.in_window = 0
        self.suppressed = 0  # since the last allowed event
        self.suppressed_total = 0

    def allow(self, now: float) -> bool:
        if now - self.window_start >= 1.0:
            self.window_start, self.in_window = now, 0
        if self.in_window < self.per_s:
            self.in_window += 1
            return True
        self.suppressed += 1
        self.suppressed_total += 1
        return False

    def take_suppressed(self) -> int:
        n, self.suppressed = self.suppressed, 0
        return n


StagesFactory = Callable[[Config], Tuple[Callable[[Any], Any], Any, str]]


class Runtime:
    """Everything `edge run` holds: opened in start(), released in close().

    `capture_factory` and `stages_factory` default to open_capture and create_stages; tests and tools pass
    their own (a source that drops out, a backend that hangs) without touching the production path.
    """

    def __init__(self, cfg: Config, log: Optional[JsonLog] = None, sinks: Optional[List[Sink]] = None,
                 capture_factory: Optional[Callable[[SourceConfig], Capture]] = None,
                 stages_factory: Optional[StagesFactory] = None, notifier: Optional[Notifier] = None):
        self.cfg = cfg
        info = read_model_info(cfg.model.path)
        self.trained = bool(info.get("trained"))
        self.log = log or JsonLog()
        if not self.trained:
            self.log.extra["warning"] = UNTRAINED_WARNING
        self.model_info = info
        self.extra_sinks = list(sinks or [])
        self.capture_factory = capture_factory or open_capture
        self.stages_factory = stages_factory or create_stages
        self.notifier = notifier
        self.pipeline: Optional[Pipeline] = None
        self.grabber: Optional[LatestFrameGrabber] = None
        self.backend: Any = None
        self.metrics: Any = None  # edge.metrics.MetricsSink when service.metrics.enabled
        self.metrics_port: Optional[int] = None
        self.telemetry: Any = None  # edge.telemetry.Telemetry when service.telemetry.enabled
        self.notify_sink: Optional[NotifySink] = None
        self.reloads = {"ok": 0, "failed": 0}
        self.source_timeouts = 0
        self._lock = threading.Lock()
        self._frame_lines = _RateLimit(MAX_FRAME_LINES_PER_S)
        self._p50: Dict[str, float] = {}
        self._p50_at = -P50_REFRESH_FRAMES
        self._source_down_since: Optional[float] = None
        self._last_timeout_log = 0.0
        self._last_image: Optional[np.ndarray] = None

    # -- logging -------------------------------------------------------------------------------------------
    def event(self, name: str, level: str = "info", **fields: Any) -> None:
        """A JSON log line; safe from the grabber and telemetry threads."""
        with self._lock:
            self.log(name, level=level, **fields)

    def _source_event(self, name: str, fields: Dict[str, Any]) -> None:
        self.event(name, level="info" if name == "source_reconnected" else "warning", **fields)

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> Pipeline:
        cfg = self.cfg
        preprocessor, backend, reason = self.stages_factory(cfg)
        backend.load()
        self.backend = backend
        labels = load_labels(labels_path(cfg.model.path, cfg.model.labels))
        sha, declared = self._model_sha(cfg.model.path, self.model_info)
        capture = self.capture_factory(cfg.source)
        self.grabber = LatestFrameGrabber(capture, cfg.source.timeout_s, cfg.service.reconnect_initial_s,
                                          cfg.service.reconnect_max_s, reopen=lambda: self.capture_factory(
                                              self.cfg.source), on_event=self._source_event).start()
        recorder = LatencyRecorder(cfg.runtime.budget_ms, cfg.runtime.latency_window)
        sinks = list(self.extra_sinks)
        telemetry_source = "off"
        if cfg.service.telemetry.enabled:
            from .telemetry import Telemetry

            self.telemetry = Telemetry(cfg.service.telemetry.interval_s, log=self.event)
            telemetry_source = "jtop" if self.telemetry.wants_jtop() else "linux"
        metrics_url = None
        if cfg.service.metrics.enabled:
            from .metrics import MetricsSink

            grabber = self.grabber
            self.metrics = MetricsSink(cfg.runtime.budget_ms, source_stats=lambda: grabber.stats(),
                                       telemetry=self.telemetry_snapshot)
            self.metrics_port = self.metrics.serve(cfg.service.metrics.host, cfg.service.metrics.port)
            self._describe_engine(backend, cfg.model.path, sha)
            metrics_url = "http://{}:{}/metrics".format(cfg.service.metrics.host, self.metrics_port)
            sinks.append(self.metrics)
        if self.notifier is None:
            self.notifier = Notifier(log=self.event)
        self.pipeline = Pipeline(self.grabber, preprocessor, backend, TopK(labels, cfg.runtime.top_k), recorder,
                                 sinks, cfg.runtime.max_consecutive_errors)
        self.notify_sink = NotifySink(self.notifier, recorder, errors=lambda: self.pipeline.errors if self.pipeline
                                      else 0)
        self.pipeline.sinks.append(self.notify_sink)
        self.event("start", source=capture.description, preprocess=getattr(preprocessor, "name", "?"),
                   budget_ms=cfg.runtime.budget_ms, weights=self.model_info.get("weights"), chosen_because=reason,
                   metrics=metrics_url, telemetry=telemetry_source, systemd=self.notifier.enabled,
                   watchdog_ping_s=self.notifier.watchdog_interval_s, sha256=sha, **backend.describe())
        self._warn_stale_info(cfg.model.path, sha, declared)
        if self.telemetry is not None:
            self.telemetry.start()
        return self.pipeline

    def telemetry_snapshot(self) -> Any:
        return self.telemetry.latest() if self.telemetry is not None else None

    def _model_sha(self, model_path: str, info: Dict[str, Any]) -> Tuple[str, Optional[str]]:
        """(sha256 of the bytes actually loaded, the sidecar's differing sha256 or None): a sidecar can be stale."""
        try:
            sha = sha256_file(model_path)
        except OSError:
            return "unknown", None
        declared = info.get("sha256")
        return sha, declared if isinstance(declared, str) and declared != sha else None

    def _warn_stale_info(self, model_path: str, sha: str, declared: Optional[str]) -> None:
        if declared is not None:
            self.event("model_info_mismatch", level="warning", model=model_path, sha256=sha, info_sha256=declared,
                       note="the model file is not the one its .json sidecar describes")

    def _describe_engine(self, backend: Any, model_path: str, sha: str) -> None:
        if self.metrics is not None:
            d = backend.describe()
            self.metrics.set_engine(d.get("backend", "?"), d.get("precision", "?"), model_path, sha)

    def warm_up(self) -> None:
        assert self.pipeline is not None
        for _ in range(self.cfg.runtime.warmup):
            self.pipeline.step(record=False)

    def report(self) -> Dict[str, Any]:
        assert self.pipeline is not None and self.grabber is not None
        summary = self.pipeline.recorder.summary()
        summary.update(self.grabber.stats(), errors=self.pipeline.errors)
        return summary

    def close(self) -> None:
        if self.grabber is not None:
            self.grabber.stop()
        if self.pipeline is not None:
            self.pipeline.close()
        elif self.metrics is not None:
            self.metrics.close()
        if self.telemetry is not None:
            self.telemetry.stop()
        if self.backend is not None:
            self.backend.close()

    # -- the loop's helpers --------------------------------------------------------------------------------
    def next_frame(self, stop: StopFlag) -> Optional[Frame]:
        """The next frame, waiting in short slices so a signal is served within ~0.25 s even with the source
        down. None when a stop or reload was requested. Raises SourceEnded (files without loop)."""
        assert self.grabber is not None
        timeout = self.cfg.source.timeout_s
        slice_s = min(0.25, timeout)
        waited = 0.0
        while not stop.event.is_set() and not stop.reload.is_set():
            try:
                frame = self.grabber.get(slice_s)
            except SourceTimeout:
                waited += slice_s
                if self.notifier is not None:
                    self.notifier.watchdog()  # the loop is alive; the source is the one that is quiet
                if waited >= timeout:
                    self._source_timeout(waited)
                    waited = 0.0
                continue
            if self._source_down_since is not None:
                self.event("source_recovered", down_s=round(time.monotonic() - self._source_down_since, 2),
                           **self.grabber.stats())
                self._source_down_since = None
            return frame
        return None

    def _source_timeout(self, waited: float) -> None:
        assert self.grabber is not None
        grabber = self.grabber
        now = time.monotonic()
        self.source_timeouts += 1
        if self._source_down_since is None:
            self._source_down_since = now - waited
        restarted = grabber.recover_stall()  # a read hung in the driver: read from a fresh capture
        down_s = now - self._source_down_since
        if self.source_timeouts <= 3 or restarted or now - self._last_timeout_log >= 30.0:
            self._last_timeout_log = now
            self.event("source_timeout", level="warning", source=grabber.capture.description,
                       down_s=round(down_s, 1), reconnecting=grabber.recovers, hung_read_restarted=restarted,
                       **grabber.stats())
        if self.notifier is not None:
            self.notifier.status("source down for {:.0f} s ({}), {} reconnects".format(
                down_s, grabber.capture.description, grabber.reconnects))

    def _recent_p50(self) -> Dict[str, float]:
        assert self.pipeline is not None
        recorder = self.pipeline.recorder
        if recorder.frames - self._p50_at >= P50_REFRESH_FRAMES:
            self._p50 = {name: float(np.percentile(recorder.stages[name].window(), 50))
                         for name in CULPRIT_STAGES if name in recorder.stages and recorder.stages[name].count}
            self._p50_at = recorder.frames
        return self._p50

    def culprit(self, stage_ms: Dict[str, float]) -> Tuple[str, float, float]:
        """(stage, ms over its recent p50, that p50) for the stage that overran most."""
        p50 = self._recent_p50()
        best, best_over = "end_to_end", -float("inf")
        for name in CULPRIT_STAGES:
            if name in stage_ms:
                over = stage_ms[name] - p50.get(name, 0.0)
                if over > best_over:
                    best, best_over = name, over
        return best, best_over, p50.get(best, 0.0)

    def after_result(self, result: Result) -> None:
        """Log what a single frame deserves (misses, errors) and the periodic summary."""
        assert self.pipeline is not None
        now = time.monotonic()
        self._last_image = result.image
        if result.status == "miss" and self._frame_lines.allow(now):
            stage, over, p50 = self.culprit(result.stage_ms)
            snap = self.telemetry_snapshot()
            self.event("frame_miss", level="warning", frame=result.frame_id, seq=result.seq, status="miss",
                       end_to_end_ms=round(result.stage_ms["end_to_end"], 3), budget_ms=self.cfg.runtime.budget_ms,
                       stage_ms={k: round(v, 3) for k, v in result.stage_ms.items()}, worst_stage=stage,
                       worst_stage_over_p50_ms=round(over, 3), worst_stage_p50_ms=round(p50, 3),
                       suppressed=self._frame_lines.take_suppressed(),
                       telemetry=snap.brief() if snap is not None else None)
        elif result.status == "error" and self._frame_lines.allow(now):
            error = result.error or ""
            self.event("frame_error", level="warning", frame=result.frame_id, seq=result.seq, status="error",
                       error_type=error.split(":", 1)[0], error=error,
                       consecutive=self.pipeline.consecutive_errors, suppressed=self._frame_lines.take_suppressed())
        recorder = self.pipeline.recorder
        if recorder.frames and recorder.frames % self.cfg.runtime.report_every == 0 and result.status != "error":
            self.event("summary", **self.summary())

    def summary(self) -> Dict[str, Any]:
        out = self.report()
        snap = self.telemetry_snapshot()
        out.update(reloads=dict(self.reloads), source_timeouts=self.source_timeouts,
                   frame_lines_suppressed=self._frame_lines.suppressed_total,
                   telemetry=snap.brief() if snap is not None else None)
        return out

    # -- SIGHUP --------------------------------------------------------------------------------------------
    def reload(self, reload_config: Callable[[], Config]) -> bool:
        """Re-read the config and swap to the model it names. The new backend is loaded and run on the latest
        frame before the swap; if anything fails the old one keeps serving. Returns True if swapped."""
        assert self.pipeline is not None
        pipeline = self.pipeline
        notifier = self.notifier
        if notifier is not None:
            notifier.reloading()
        started = time.monotonic()
        old = self.backend.describe() if self.backend is not None else {}
        backend: Any = None
        try:
            new_cfg = reload_config()
            info = read_model_info(new_cfg.model.path)
            preprocessor, backend, _reason = self.stages_factory(new_cfg)
            backend.load()
            labels = load_labels(labels_path(new_cfg.model.path, new_cfg.model.labels))
            postprocess = TopK(labels, new_cfg.runtime.top_k)
            image = self._last_image
            if image is None:
                image = np.zeros((self.cfg.source.height, self.cfg.source.width, 3), np.uint8)
            prediction = postprocess(backend.infer(preprocessor(image)))  # proves the new model runs here
            if not prediction.labels:
                raise EdgeError("{}: the new model produced no prediction".format(new_cfg.model.path))
        except Exception as exc:  # anything: a bad config, a missing or corrupt model, a model that fails to run
            if backend is not None:
                try:
                    backend.close()
                except Exception:
                    pass
            self.reloads["failed"] += 1
            if self.metrics is not None:
                self.metrics.reloads.labels("failed").inc()
            self.event("reload_failed", level="error", error_type=type(exc).__name__, error=str(exc),
                       kept="old backend keeps serving", still_serving=old.get("model"), **_prefixed(old, "old_"))
            if notifier is not None:
                notifier.ready("reload failed ({}), still serving {}".format(type(exc).__name__, old.get("model")))
            return False
        previous = self.backend
        pipeline.preprocess, pipeline.backend, pipeline.postprocess = preprocessor, backend, postprocess
        self.backend = backend
        if previous is not None:
            try:
                previous.close()
            except Exception as exc:
                self.event("reload_close_failed", level="warning", error="{}: {}".format(type(exc).__name__, exc))
        restart_needed = [key for key in ("source", "service") if getattr(new_cfg, key) != getattr(self.cfg, key)]
        if new_cfg.runtime.budget_ms != self.cfg.runtime.budget_ms:
            restart_needed.append("runtime.budget_ms")
        # what was applied: model, preprocess, backend, top_k, error limit; the rest waits for a restart
        self.cfg.model, self.cfg.preprocess, self.cfg.backend = new_cfg.model, new_cfg.preprocess, new_cfg.backend
        self.cfg.runtime.top_k = new_cfg.runtime.top_k
        self.cfg.runtime.max_consecutive_errors = pipeline.max_consecutive_errors = \
            new_cfg.runtime.max_consecutive_errors
        self.model_info = info
        self.trained = bool(info.get("trained"))
        if self.trained:
            self.log.extra.pop("warning", None)
        else:
            self.log.extra["warning"] = UNTRAINED_WARNING
        sha, declared = self._model_sha(new_cfg.model.path, info)
        self._describe_engine(backend, new_cfg.model.path, sha)
        self.reloads["ok"] += 1
        if self.metrics is not None:
            self.metrics.reloads.labels("ok").inc()
        self.event("reload", took_ms=round((time.monotonic() - started) * 1e3, 1), sha256=sha,
                   weights=info.get("weights"), restart_needed=restart_needed, previous_model=old.get("model"),
                   **backend.describe())
        self._warn_stale_info(new_cfg.model.path, sha, declared)
        if notifier is not None:
            notifier.ready("reloaded: serving {}".format(new_cfg.model.path))
        return True


def _prefixed(d: Dict[str, Any], prefix: str) -> Dict[str, Any]:
    return {prefix + k: v for k, v in d.items()}


def run(cfg: Config, log: Optional[JsonLog] = None, stop: Optional[StopFlag] = None,
        reload_config: Optional[Callable[[], Config]] = None, runtime: Optional[Runtime] = None) -> Dict[str, Any]:
    """Run until `runtime.frames` frames, the end of the source, or a stop signal. Returns the final report.

    `reload_config` builds the config SIGHUP switches to (default: re-read `cfg.path`, or keep `cfg` and reload
    the model file at the same path when there is no config file)."""
    if stop is None:
        stop = StopFlag()
        stop.install()  # first, so a SIGHUP during start-up does not kill the process
    runtime = runtime or Runtime(cfg, log)
    cfg = runtime.cfg
    if reload_config is None:
        path = cfg.path
        reload_config = (lambda: load_config(path)) if path else (lambda: cfg)
    failure: Optional[TooManyErrors] = None
    try:
        pipeline = runtime.start()
        warmup = cfg.runtime.warmup
        ended_by = "frames"
        try:
            while True:
                if stop.event.is_set():
                    ended_by = "signal {}".format(stop.signal)
                    break
                if stop.reload.is_set():
                    stop.reload.clear()
                    runtime.reload(reload_config)
                    continue
                if cfg.runtime.frames and pipeline.recorder.frames >= cfg.runtime.frames:
                    break
                frame = runtime.next_frame(stop)
                if frame is None:
                    continue
                if warmup > 0:  # timed but not recorded; its errors are logged and counted all the same
                    warmup -= 1
                    runtime.after_result(pipeline.process(frame, record=False))
                    continue
                runtime.after_result(pipeline.process(frame))
        except SourceEnded:
            ended_by = "end of source"
        except TooManyErrors as exc:
            ended_by = "too many errors"
            failure = exc
        report = runtime.report()
        report["ended_by"] = ended_by
        snap = runtime.telemetry_snapshot()
        report.update(reloads=dict(runtime.reloads), source_timeouts=runtime.source_timeouts,
                      telemetry=snap.brief() if snap is not None else None)
        if runtime.notifier is not None:
            if failure is not None:
                runtime.notifier.status("failed: {}".format(failure))
            else:
                runtime.notifier.stopping("stopping ({}): {} frames, {} misses".format(
                    ended_by, report["frames"], report["misses"]))
        runtime.event("report", level="error" if failure is not None else "info", **report)
        header = ["edge run: {} on {} - {}".format(runtime.backend.describe()["backend"], cfg.source.uri,
                                                   "trained weights" if runtime.trained else UNTRAINED_WARNING)]
        print(format_table(report, header), file=sys.stderr, flush=True)
        if failure is not None:
            raise EdgeError(" ".join(str(failure).split()), EXIT_FAIL) from failure  # one line
        return report
    finally:
        runtime.close()

