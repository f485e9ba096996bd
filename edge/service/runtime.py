"""The service around the frame path. The way of one frame, top to bottom:

    with Runtime(cfg, sinks) as rt:       # the stages, the cameras (1..N) and the service's own sinks
        for batch in rt.frames(stop):      # what the batcher serves next; a SIGHUP reloads between two batches
            rt.process(batch)              # Stages.classify(_batch), timed -> a Result each, with its counters ->
                                           # every sink
One camera is a batch of one, served on arrival. edge/service/loop.py is that loop and the final report: every
command that runs frames uses it. Sinks get all they report in the Result; the cameras (edge/sources/cameras.py)
own their recovery (edge/sources/watch.py) and the batching.

What it writes (JSON lines on stdout; under systemd journald takes the `<N>` priority prefix JsonLog adds):
  start                 once: backend, model, source, preprocess, budget, metrics address, telemetry source
  frame_miss / frame_error (warning), summary: see edge/service/frame_log.py
  source_* (warning)    a live source fault, reconnect attempt and recovery; source_timeout when no frame came
  overload / overload_ended  no frame can make the budget: every camera served best effort (each late result a miss)
  telemetry_*           jtop degraded / recovered (with the reason)
  reload*               SIGHUP: which model now serves, or why the old one kept serving
  report                last: the final report (edge/service/loop.py)
"""

import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from edge.config import Config, SourceConfig, cameras, load_config
from edge.errors import EdgeError
from edge.fields import lookup, reloaded
from edge.infer.latency import LatencyRecorder
from edge.infer.pipeline import Pipeline, Result, Sink
from edge.infer.stages import Stages, build_stages, create_stages
from edge.service.frame_log import FrameLogSink, report_fields
from edge.service.log import JsonLog
from edge.service.notify import Notifier, NotifySink
from edge.service.parts import ServicePart, WarningTag
from edge.service.reload import Loading
from edge.service.results import results_sinks
from edge.service.signals import StopFlag
from edge.sources.cameras import Batch, Cameras
from edge.sources.source import Capture, SourceEnded, open_capture
from edge.uri import metrics_url

SLICE_S = 0.25  # the longest wait for a frame before stop and reload requests are looked at again

# how a reload applies each reload=APPLY key the new stages do not read (edge.infer.stages.STAGE_KEYS); a key marked
# APPLY with neither fails tests/test_config.py
APPLIERS: Dict[str, Callable[[Pipeline, Any], None]] = {
    "runtime.max_consecutive_errors": lambda pipeline, value: setattr(pipeline, "max_consecutive_errors", value),
}


class Runtime:
    """Everything a frame loop holds: opened on `with` (start), released at its end (close).

    `reload_config` builds the config a SIGHUP switches to (default: re-read `cfg.path`; without a config file,
    the same config, so the model file at the same path is reloaded). `capture_factory` and `stages_factory`
    default to open_capture and create_stages; tests put a source that drops out or a backend that hangs behind
    the same path. `stages`: loaded stages to run on instead, borrowed (`edge sweep` runs many short runs on one
    model): close() leaves them open."""

    def __init__(self, cfg: Config, sinks: Optional[List[Sink]] = None, log: Optional[JsonLog] = None,
                 reload_config: Optional[Callable[[], Config]] = None,
                 capture_factory: Optional[Callable[[SourceConfig], Capture]] = None,
                 stages_factory: Optional[Callable[[Config], Any]] = None, stages: Optional[Stages] = None):
        self.cfg = cfg
        self.log = log or JsonLog()
        self.sinks = list(sinks or [])  # the command's; start() adds the service's own
        path = cfg.path
        self.reload_config = reload_config or ((lambda: load_config(path)) if path else (lambda: cfg))
        self.capture_factory = capture_factory or open_capture
        self.stages_factory = stages_factory or create_stages
        self._borrowed = stages
        self.pipeline: Optional[Pipeline] = None
        self.source: Optional[Cameras] = None  # the cameras served (config `sources`, else the one `source`)
        self.metrics: Any = None  # edge.service.metrics.MetricsSink when service.metrics.enabled
        self.metrics_port: Optional[int] = None
        self.telemetry: Any = None  # edge.service.telemetry.Telemetry when service.telemetry.enabled
        self.facts: Dict[str, Any] = {}  # what the start line said: backend, precision, source, why chosen ...
        self.reloads = {"ok": 0, "failed": 0}
        self.ended_by = "not started"
        self._warmup = cfg.runtime.warmup  # frames still to time without recording
        self._last_image: Optional[np.ndarray] = None
        self._lock = threading.Lock()
        self._reported = False  # the report line is written: nothing follows it
        self._loading: Optional[Loading] = None  # a SIGHUP reload in flight
        self._overload: Optional[str] = None  # why the cameras are served best effort, as last logged
        self.notifier = Notifier(log=self.event)  # sd_notify; a no-op outside systemd

    @property
    def stages(self) -> Stages:
        assert self.pipeline is not None, "start first"
        return self.pipeline.stages

    def event(self, name: str, level: str = "info", **fields: Any) -> None:
        """A JSON log line; safe from the source and telemetry threads. The report is the last line: what those
        threads say while the runtime closes (a jtop connection failing late, a source fault) is dropped."""
        with self._lock:
            if self._reported:
                return
            self.log(name, level=level, **fields)
            self._reported = name == "report"

    # -- lifecycle -----------------------------------------------------------------------------------------
    def __enter__(self) -> "Runtime":
        try:
            self.start()
        except BaseException as exc:
            self.close()
            if isinstance(exc, Exception) and not isinstance(exc, EdgeError):  # a backend or source failing in
                raise EdgeError("cannot start the pipeline: {}: {}".format(  # its own way: still one line
                    type(exc).__name__, exc)) from None
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        cfg = self.cfg
        stages = self._borrowed or build_stages(cfg, self.stages_factory)
        recorder = LatencyRecorder(cfg.runtime.budget_ms, cfg.runtime.latency_window)
        self.pipeline = Pipeline(stages, recorder, cfg.runtime.max_consecutive_errors)
        self.source = Cameras(cameras(cfg), cfg.runtime, self.capture_factory,
                              reconnect_initial_s=cfg.service.reconnect_initial_s,
                              reconnect_max_s=cfg.service.reconnect_max_s, on_event=self._source_event,
                              give_up_at_start=not self.notifier.enabled).start(stages)  # under systemd: waited for
        self._start_services(recorder)
        self._serving(stages)
        self.facts = dict(stages.facts(), source=self.source.description, budget_ms=cfg.runtime.budget_ms,
                          **self.source.facts())
        self.event("start", metrics=self._metrics_url(), telemetry=self._telemetry_source(),
                   systemd=self.notifier.enabled, watchdog_ping_s=self.notifier.watchdog_interval_s, **self.facts)
        self._warn_stale_info(stages)
        if self.telemetry is not None:
            self.telemetry.start()

    def _start_services(self, recorder: LatencyRecorder) -> None:
        cfg, source = self.cfg, self.source
        assert source is not None
        if cfg.service.telemetry.enabled:
            from edge.service.telemetry import Telemetry

            self.telemetry = Telemetry(cfg.service.telemetry.interval_s, log=self.event)
        if cfg.service.metrics.enabled:
            from edge.service.metrics import MetricsSink

            self.metrics = MetricsSink(cfg.runtime.budget_ms, source_stats=source.stats,
                                       telemetry=self.telemetry.latest if self.telemetry is not None else None,
                                       camera_stats=source.drops if source.several else None,
                                       degraded=self.degraded)
            self.sinks.append(self.metrics)  # closed with the others, even if serving fails
            self.metrics_port = self.metrics.serve(cfg.service.metrics.host, cfg.service.metrics.port)
        self.sinks.append(FrameLogSink(self.event, recorder, cfg.runtime.budget_ms, cfg.runtime.report_every))
        self.sinks.append(NotifySink(self.notifier, recorder, degraded=self.degraded))
        self.sinks.extend(results_sinks(cfg.service.results))
        self.sinks.append(WarningTag(self.log.extra))

    def _parts(self) -> List[ServicePart]:
        return [sink for sink in self.sinks if isinstance(sink, ServicePart)]

    def degraded(self) -> Optional[str]:
        """Why the service runs degraded now (the stages stand in for the configured ones, or the cameras are
        served best effort), or None."""
        return self.stages.degraded or (self.source.degraded if self.source is not None else None)

    def _serving(self, stages: Stages) -> None:
        for part in self._parts():
            part.serving(stages)

    def _metrics_url(self) -> Optional[str]:
        """The start line's URL (an IPv6 address in brackets; "" is 0.0.0.0). A host beyond loopback gets the
        warning the demo gives: anyone who can reach the port can read the metrics."""
        if self.metrics_port is None:
            return None
        host = self.cfg.service.metrics.host or "0.0.0.0"
        if host not in ("127.0.0.1", "localhost", "::1"):
            self.event("metrics_exposed", level="warning", host=host, port=self.metrics_port,
                       note="listening beyond this machine: anyone who can reach it can read the metrics")
        return metrics_url(host, self.metrics_port, local_client=False)

    def _telemetry_source(self) -> str:
        if self.telemetry is None:
            return "off"
        return "jtop" if self.telemetry.wants_jtop() else "linux"

    def _warn_stale_info(self, stages: Stages) -> None:
        for note in stages.notes:  # a stale model info is refused at load (edge.store.artifact.read_set)
            self.event("model_note", level="warning", model=stages.model_path, note=note)

    def _source_event(self, name: str, fields: Dict[str, Any]) -> None:
        """The cameras' faults, reconnects and timeouts: logged, and the outage told to systemd."""
        self.event(name, level="info" if name in ("source_reconnected", "source_recovered") else "warning", **fields)
        if name == "source_start_timeout" and not self.notifier.ready_sent:  # under systemd: up, degraded
            self.notifier.ready("degraded: {}; retrying with backoff".format(fields["error"]))
        elif name == "source_timeout":
            self.notifier.status("source down for {:.0f} s ({}), {} reconnects".format(
                fields["down_s"], fields["source"], fields["reconnects"]))

    def report(self) -> Dict[str, Any]:
        """The counters and latency statistics so far."""
        assert self.pipeline is not None and self.source is not None
        out = report_fields(self.pipeline.recorder, self.source.stats(), self.pipeline.errors, self.reloads,
                            self.telemetry.latest() if self.telemetry is not None else None, self.pipeline.classes)
        out.update(self.source.figures())
        return out

    def final_report(self, failure: Optional[Exception] = None) -> Dict[str, Any]:
        """The report line, last, and systemd told why the loop ended; `failure`: the loop ends on it."""
        if failure is not None:
            self.ended_by = "too many errors"
        report = dict(self.report(), ended_by=self.ended_by)
        if failure is not None:
            self.notifier.status("failed: {}".format(failure))
        else:
            self.notifier.stopping("stopping ({}): {} frames, {} misses".format(
                self.ended_by, report["frames"], report["misses"]))
        self.event("report", level="error" if failure is not None else "info", **report)
        return report

    def close(self) -> None:
        if self._loading is not None:
            self._loading.discard()
            self._loading = None
        if self.source is not None:
            self.source.stop()
        for sink in self.sinks:
            sink.close()
        if self.pipeline is not None and self.pipeline.stages is not self._borrowed:
            self.pipeline.stages.close()
        if self.telemetry is not None:
            self.telemetry.stop()

    # -- frames --------------------------------------------------------------------------------------------
    def frames(self, stop: StopFlag) -> Iterator[Batch]:
        """Batches (one camera: a frame each) until a stop request, `runtime.frames` timed frames, or the end of
        every file source (`ended_by` says which). Between two batches it serves SIGHUP; while the cameras are quiet,
        the watchdog (the loop is alive: restarting would not bring a camera back) and stop requests within
        SLICE_S."""
        assert self.pipeline is not None and self.source is not None
        limit = self.cfg.runtime.frames
        while True:
            if stop.stopped:
                self.ended_by = stop.reason or "stopped"
                return
            if stop.reload.is_set():
                stop.reload.clear()
                self.request_reload()
            self.finish_reload()
            if limit and self.pipeline.recorder.frames >= limit:
                self.ended_by = "frames"
                return
            try:
                batch = self.source.next_batch(min(SLICE_S, self.cfg.source.timeout_s))
            except SourceEnded:
                self.ended_by = "end of source"
                return
            except EdgeError:
                raise
            except Exception as exc:  # a file source that failed in its own way (files do not reconnect)
                raise EdgeError("{}: {}: {}".format(self.cfg.source.uri, type(exc).__name__, exc)) from None
            if batch is None:
                self.notifier.watchdog()
                continue
            yield batch

    def process(self, batch: Batch) -> List[Result]:
        """A batch through the stages, a Result per frame; warm-up frames (`runtime.warmup`) are timed, not
        recorded or delivered, failed ones always delivered. Raises TooManyErrors past
        `runtime.max_consecutive_errors` in a row."""
        assert self.pipeline is not None and self.source is not None
        limit, count = self.cfg.runtime.frames, len(batch.frames)
        timed = 0 if self._warmup > 0 else min(count, limit - self.pipeline.recorder.frames) if limit else count
        self._warmup -= count
        self._last_image = batch.frames[-1].image
        several = self.source.several  # one camera's results name none
        results = self.pipeline.process_batch(batch.frames, [c.name if several else "" for c in batch.cameras],
                                              timed)
        self.source.finished(batch, results, timed)
        self._log_overload()
        source, cameras = self.source.stats(), self.source.counters()
        for i, result in enumerate(results):
            if i < timed or result.status == "error":
                result.source, result.cameras = source, cameras
                result.telemetry = self.telemetry.latest() if self.telemetry is not None else None
                result.reloads = dict(self.reloads)
                for sink in self.sinks:
                    sink.on_result(result)
        return results

    def _log_overload(self) -> None:
        """The cameras' overload, logged as it starts and ends (and told to systemd with every STATUS)."""
        assert self.source is not None
        why = self.source.degraded
        if bool(why) != bool(self._overload):
            if why is not None:
                self.event("overload", level="warning", reason=why, budget_ms=self.cfg.runtime.budget_ms)
            else:
                self.event("overload_ended", was=self._overload)
            self._overload = why

    # -- SIGHUP --------------------------------------------------------------------------------------------
    def request_reload(self) -> None:
        """Start loading the stages the config now names, beside the serving ones (edge/service/reload.py); a
        request during a load asks for one more load after it."""
        if self._loading is not None:
            self._loading.again = True
            return
        self.notifier.reloading()
        image, factory, read_config = self._last_image, self.stages_factory, self.reload_config

        def load() -> Tuple[Config, Stages]:
            new_cfg = read_config()
            return new_cfg, _proven_stages(new_cfg, factory, image)

        self._loading = Loading(load)

    def finish_reload(self) -> Optional[bool]:
        """Between two frames: once the load is done, swap to its stages (True) or keep the old ones serving and
        say why (False); None while nothing is loaded or the load goes on."""
        loading = self._loading
        if loading is None or not loading.done:
            return None
        self._loading = None
        swapped = self._swap(loading)
        if loading.again:
            self.request_reload()
        return swapped

    def reload(self) -> bool:
        """A whole reload, waited for: re-read the config and swap to the stages it names once they are loaded and
        have run on the latest frame; if anything fails the old ones keep serving. Returns True if swapped."""
        self.request_reload()
        assert self._loading is not None
        self._loading.wait()
        return bool(self.finish_reload())

    def _swap(self, loading: Loading) -> bool:
        assert self.pipeline is not None
        pipeline, notifier, old = self.pipeline, self.notifier, self.pipeline.stages
        if loading.error is not None or loading.result is None:
            exc = loading.error or EdgeError("the reload loaded nothing")
            self._count_reload("failed")
            self.event("reload_failed", level="error", error_type=type(exc).__name__, error=str(exc),
                       kept="old backend keeps serving", still_serving=old.model_path,
                       **{"old_" + k: v for k, v in old.description.items()})
            notifier.ready("reload failed ({}), still serving {}".format(type(exc).__name__, old.model_path))
            return False
        new_cfg, stages = loading.result
        pipeline.stages = stages  # the swap: one object, between two frames
        assert self.source is not None
        self.source.restage(stages)  # the batch sizes the new model takes, its staging buffers
        for key, apply in APPLIERS.items():
            apply(pipeline, lookup(new_cfg, key))
        try:
            old.close()
        except Exception as exc:
            self.event("reload_close_failed", level="warning", error="{}: {}".format(type(exc).__name__, exc))
        self._apply(new_cfg, stages, old, loading.started)
        notifier.ready("reloaded: serving {}".format(new_cfg.model.path))
        return True

    def _count_reload(self, outcome: str) -> None:
        self.reloads[outcome] += 1
        for part in self._parts():
            part.reload_done(outcome)

    def _apply(self, new_cfg: Config, stages: Stages, old: Stages, started: float) -> None:
        # the keys declared reloadable (edge/config.py) are applied; the other changed keys wait for a restart
        self.cfg, restart_needed = reloaded(self.cfg, new_cfg)
        self._serving(stages)
        self.facts = dict(self.facts, **stages.facts())
        self._count_reload("ok")
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
        if not stages.classify(image).labels:
            raise EdgeError("{}: the new model produced no prediction".format(cfg.model.path))
    except BaseException:
        stages.close()
        raise
    return stages
