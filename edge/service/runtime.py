"""The service around the frame path: Runtime wires the stages, the grabber and the sinks (metrics, sd_notify,
frame log, telemetry), serves a live source's timeouts and reconnects, and swaps the model on SIGHUP.
edge/service/loop.py drives it: the one frame loop every command uses.

What it writes (JSON lines on stdout; under systemd journald takes the `<N>` priority prefix JsonLog adds):
  start                 once: backend, model, source, preprocess, budget, metrics address, telemetry source
  frame_miss / frame_error (warning), summary: see edge/service/frame_log.py
  source_* (warning)    a live source fault, reconnect attempt and recovery; source_timeout when no frame came
  telemetry_*           jtop degraded / recovered (with the reason)
  reload*               SIGHUP: which model now serves, or why the old one kept serving
  report                last: the final report (edge/service/loop.py)
"""

import signal
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from edge.config import Config, SourceConfig
from edge.errors import EdgeError
from edge.frame.latency import LatencyRecorder
from edge.frame.pipeline import Pipeline, Sink
from edge.frame.sources import Capture, Frame, LatestFrameGrabber, SourceTimeout, open_capture
from edge.frame.stages import Stages, build_stages, create_stages
from edge.service.frame_log import FrameLogSink
from edge.service.log import JsonLog
from edge.service.notify import Notifier, NotifySink

FIRST_FRAME_TIMEOUT_S = 10.0  # a source silent this long after start (or source.timeout_s if longer) is dead
class StopFlag:
    """SIGINT/SIGTERM set `event` (the loop finishes the frame in hand, then reports); SIGHUP sets `reload`."""

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


class Runtime:
    """Everything a frame loop holds: opened in start(), released in close().

    `capture_factory` and `stages_factory` default to open_capture and create_stages; tests and tools pass
    their own (a source that drops out, a backend that hangs) without touching the production path.
    """

    def __init__(self, cfg: Config, log: Optional[JsonLog] = None, sinks: Optional[List[Sink]] = None,
                 capture_factory: Optional[Callable[[SourceConfig], Capture]] = None,
                 stages_factory: Optional[Callable[[Config], Any]] = None, notifier: Optional[Notifier] = None):
        self.cfg = cfg
        self.log = log or JsonLog()
        self.extra_sinks = list(sinks or [])
        self.capture_factory = capture_factory or open_capture
        self.stages_factory = stages_factory or create_stages
        self.notifier = notifier
        self.pipeline: Optional[Pipeline] = None
        self.grabber: Optional[LatestFrameGrabber] = None
        self.metrics: Any = None  # edge.service.metrics.MetricsSink when service.metrics.enabled
        self.metrics_port: Optional[int] = None
        self.telemetry: Any = None  # edge.service.telemetry.Telemetry when service.telemetry.enabled
        self.frame_log: Optional[FrameLogSink] = None
        self.facts: Dict[str, Any] = {}  # what the start line said: backend, precision, source, why chosen ...
        self.reloads = {"ok": 0, "failed": 0}
        self.source_timeouts = 0
        self._lock = threading.Lock()
        self._source_down_since: Optional[float] = None
        self._last_timeout_log = 0.0
        self._last_fault: Optional[str] = None
        self._last_image: Optional[np.ndarray] = None
        self._seen_frame = False

    @property
    def stages(self) -> Stages:
        assert self.pipeline is not None, "start() first"
        return self.pipeline.stages

    @property
    def backend(self) -> Any:
        return self.stages.backend

    @property
    def trained(self) -> bool:
        return self.stages.trained

    def event(self, name: str, level: str = "info", **fields: Any) -> None:
        """A JSON log line; safe from the grabber and telemetry threads."""
        with self._lock:
            self.log(name, level=level, **fields)

    def _source_event(self, name: str, fields: Dict[str, Any]) -> None:
        if "error" in fields:  # kept for the start error: "EdgeError: <uri>: cannot open source" -> the reason
            self._last_fault = str(fields["error"]).replace("EdgeError: ", "").replace(
                str(fields.get("source", "")) + ": ", "")
        self.event(name, level="info" if name == "source_reconnected" else "warning", **fields)

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> Pipeline:
        cfg = self.cfg
        stages = build_stages(cfg, self.stages_factory)
        recorder = LatencyRecorder(cfg.runtime.budget_ms, cfg.runtime.latency_window)
        self.pipeline = Pipeline(stages, recorder, list(self.extra_sinks), cfg.runtime.max_consecutive_errors)
        capture = self.capture_factory(cfg.source)
        self.grabber = LatestFrameGrabber(capture, cfg.source.timeout_s, cfg.service.reconnect_initial_s,
                                          cfg.service.reconnect_max_s, reopen=lambda: self.capture_factory(cfg.source),
                                          on_event=self._source_event).start()
        self._start_services(recorder)
        self._set_untrained_warning(stages)
        self.facts = dict(stages.facts(), source=capture.description, budget_ms=cfg.runtime.budget_ms)
        self.event("start", metrics=self._metrics_url(), telemetry=self._telemetry_source(),
                   systemd=self.notifier.enabled if self.notifier else False,
                   watchdog_ping_s=self.notifier.watchdog_interval_s if self.notifier else None, **self.facts)
        self._warn_stale_info(stages)
        if self.telemetry is not None:
            self.telemetry.start()
        return self.pipeline

    def _start_services(self, recorder: LatencyRecorder) -> None:
        cfg, pipeline, grabber = self.cfg, self.pipeline, self.grabber
        assert pipeline is not None and grabber is not None
        if cfg.service.telemetry.enabled:
            from edge.service.telemetry import Telemetry

            self.telemetry = Telemetry(cfg.service.telemetry.interval_s, log=self.event)
        if cfg.service.metrics.enabled:
            from edge.service.metrics import MetricsSink

            self.metrics = MetricsSink(cfg.runtime.budget_ms, source_stats=grabber.stats,
                                       telemetry=self.telemetry_snapshot)
            self.metrics_port = self.metrics.serve(cfg.service.metrics.host, cfg.service.metrics.port)
            self._describe_engine(pipeline.stages)
            pipeline.sinks.append(self.metrics)
        if self.notifier is None:
            self.notifier = Notifier(log=self.event)
        self.frame_log = FrameLogSink(self.event, recorder, cfg.runtime.budget_ms, cfg.runtime.report_every,
                                      self.telemetry_snapshot, self.summary, lambda: pipeline.consecutive_errors)
        pipeline.sinks.append(self.frame_log)
        pipeline.sinks.append(NotifySink(self.notifier, recorder, errors=lambda: pipeline.errors))

    def _metrics_url(self) -> Optional[str]:
        """The start line's URL (an IPv6 address in brackets; "" is 0.0.0.0). A host beyond loopback gets the
        warning the demo gives: anyone who can reach the port can read the metrics."""
        if self.metrics_port is None:
            return None
        host = self.cfg.service.metrics.host or "0.0.0.0"
        if host not in ("127.0.0.1", "localhost", "::1"):
            self.event("metrics_exposed", level="warning", host=host, port=self.metrics_port,
                       note="listening beyond this machine: anyone who can reach it can read the metrics")
        return "http://{}:{}/metrics".format("[{}]".format(host) if ":" in host else host, self.metrics_port)

    def _telemetry_source(self) -> str:
        if self.telemetry is None:
            return "off"
        return "jtop" if self.telemetry.wants_jtop() else "linux"

    def _set_untrained_warning(self, stages: Stages) -> None:
        if stages.warning:
            self.log.extra["warning"] = stages.warning
        else:
            self.log.extra.pop("warning", None)

    def _warn_stale_info(self, stages: Stages) -> None:
        if stages.stale_info_sha256 is not None:
            self.event("model_info_mismatch", level="warning", model=stages.model_path, sha256=stages.sha256,
                       info_sha256=stages.stale_info_sha256,
                       note="the model file is not the one its .json sidecar describes")

    def _describe_engine(self, stages: Stages) -> None:
        if self.metrics is not None:
            d = stages.description
            self.metrics.set_engine(d.get("backend", "?"), d.get("precision", "?"), stages.model_path, stages.sha256)

    def telemetry_snapshot(self) -> Any:
        return self.telemetry.latest() if self.telemetry is not None else None

    def report(self) -> Dict[str, Any]:
        assert self.pipeline is not None and self.grabber is not None
        summary = self.pipeline.recorder.summary()
        summary.update(self.grabber.stats(), errors=self.pipeline.errors)
        return summary

    def summary(self) -> Dict[str, Any]:
        out = self.report()
        snap = self.telemetry_snapshot()
        out.update(reloads=dict(self.reloads), source_timeouts=self.source_timeouts,
                   frame_lines_suppressed=self.frame_log.lines.suppressed_total if self.frame_log else 0,
                   telemetry=snap.brief() if snap is not None else None)
        return out

    def close(self) -> None:
        if self.grabber is not None:
            self.grabber.stop()
        if self.pipeline is not None:
            self.pipeline.close()
            self.pipeline.stages.close()
        elif self.metrics is not None:
            self.metrics.close()
        if self.telemetry is not None:
            self.telemetry.stop()

    # -- frames --------------------------------------------------------------------------------------------
    def next_frame(self, stop: StopFlag) -> Optional[Frame]:
        """The next frame, waiting in short slices so a signal is served within ~0.25 s even with the source
        down. None when a stop or reload was requested. Raises SourceEnded (files without loop), and EdgeError
        when no first frame came in time."""
        assert self.grabber is not None
        timeout = self.cfg.source.timeout_s
        first_deadline = time.monotonic() + max(FIRST_FRAME_TIMEOUT_S, timeout)
        slice_s = min(0.25, timeout)
        waited = 0.0
        while not stop.event.is_set() and not stop.reload.is_set():
            try:
                frame = self.grabber.get(slice_s)
            except SourceTimeout:
                waited += slice_s
                if self.notifier is not None:
                    self.notifier.watchdog()  # the loop is alive; the source is the one that is quiet
                if not self._seen_frame and time.monotonic() >= first_deadline:
                    raise EdgeError("{}: no frame within {:.0f} s of start{}".format(
                        self.grabber.capture.description, max(FIRST_FRAME_TIMEOUT_S, timeout),
                        " (last fault: {})".format(self._last_fault) if self._last_fault else "")) from None
                if waited >= timeout:
                    self._source_timeout(waited)
                    waited = 0.0
                continue
            self._seen_frame = True
            self._last_image = frame.image
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

    # -- SIGHUP --------------------------------------------------------------------------------------------
    def reload(self, reload_config: Callable[[], Config]) -> bool:
        """Re-read the config and swap to the stages it names. The new stages are loaded and run on the latest
        frame before the swap; if anything fails the old ones keep serving. Returns True if swapped."""
        assert self.pipeline is not None
        pipeline, notifier = self.pipeline, self.notifier
        if notifier is not None:
            notifier.reloading()
        started = time.monotonic()
        old = pipeline.stages
        try:
            new_cfg = reload_config()
            stages = _proven_stages(new_cfg, self.stages_factory, self._last_image)
        except Exception as exc:  # anything: a bad config, a missing or corrupt model, a model that fails to run
            self.reloads["failed"] += 1
            if self.metrics is not None:
                self.metrics.reloads.labels("failed").inc()
            self.event("reload_failed", level="error", error_type=type(exc).__name__, error=str(exc),
                       kept="old backend keeps serving", still_serving=old.model_path,
                       **{"old_" + k: v for k, v in old.description.items()})
            if notifier is not None:
                notifier.ready("reload failed ({}), still serving {}".format(type(exc).__name__, old.model_path))
            return False
        pipeline.stages = stages  # the swap: one object, between two frames
        pipeline.max_consecutive_errors = new_cfg.runtime.max_consecutive_errors
        try:
            old.close()
        except Exception as exc:
            self.event("reload_close_failed", level="warning", error="{}: {}".format(type(exc).__name__, exc))
        self._apply(new_cfg, stages, old, started)
        if notifier is not None:
            notifier.ready("reloaded: serving {}".format(new_cfg.model.path))
        return True

    def _apply(self, new_cfg: Config, stages: Stages, old: Stages, started: float) -> None:
        restart_needed = [key for key in ("source", "service") if getattr(new_cfg, key) != getattr(self.cfg, key)]
        if new_cfg.runtime.budget_ms != self.cfg.runtime.budget_ms:
            restart_needed.append("runtime.budget_ms")
        # what was applied: model, preprocess, backend, top_k, error limit; the rest waits for a restart
        self.cfg = replace(self.cfg, model=new_cfg.model, preprocess=new_cfg.preprocess, backend=new_cfg.backend,
                           runtime=replace(self.cfg.runtime, top_k=new_cfg.runtime.top_k,
                                           max_consecutive_errors=new_cfg.runtime.max_consecutive_errors))
        self._set_untrained_warning(stages)
        self.facts = dict(self.facts, **stages.facts())
        self._describe_engine(stages)
        self.reloads["ok"] += 1
        if self.metrics is not None:
            self.metrics.reloads.labels("ok").inc()
        self.event("reload", took_ms=round((time.monotonic() - started) * 1e3, 1), sha256=stages.sha256,
                   weights=stages.model_info.get("weights"), restart_needed=restart_needed,
                   previous_model=old.model_path, **stages.description)
        self._warn_stale_info(stages)


def _proven_stages(cfg: Config, factory: Callable[[Config], Any], image: Optional[np.ndarray]) -> Stages:
    """Stages for `cfg` that have classified `image` (or a black frame) once: proof the model runs here."""
    stages = build_stages(cfg, factory)
    try:
        if image is None:
            image = np.zeros((cfg.source.height, cfg.source.width, 3), np.uint8)
        prediction = stages.postprocess(stages.backend.infer(stages.preprocess(image)))
        if not prediction.labels:
            raise EdgeError("{}: the new model produced no prediction".format(cfg.model.path))
    except BaseException:
        stages.close()
        raise
    return stages


