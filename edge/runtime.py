"""`edge run`: the runtime loop from a config, with periodic JSON summaries and a final report."""

import signal
import sys
import threading
from typing import Any, Dict, List, Optional

from .config import Config, labels_path
from .factory import create_stages
from .latency import LatencyRecorder, format_table
from .log import JsonLog
from .modelinfo import UNTRAINED_WARNING, read_model_info
from .pipeline import Pipeline, Sink
from .postprocess import TopK, load_labels
from .sources import LatestFrameGrabber, SourceEnded, open_capture


class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes the frame in hand, then reports and exits 0."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: Optional[int] = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signal = signum
        self.event.set()


class Runtime:
    """Everything `edge run` holds: opened in start(), released in close()."""

    def __init__(self, cfg: Config, log: Optional[JsonLog] = None, sinks: Optional[List[Sink]] = None):
        self.cfg = cfg
        info = read_model_info(cfg.model.path)
        self.trained = bool(info.get("trained"))
        self.log = log or JsonLog()
        if not self.trained:
            self.log.extra["warning"] = UNTRAINED_WARNING
        self.model_info = info
        self.extra_sinks = list(sinks or [])
        self.pipeline: Optional[Pipeline] = None
        self.grabber: Optional[LatestFrameGrabber] = None
        self.backend: Any = None

    def start(self) -> Pipeline:
        cfg = self.cfg
        preprocessor, backend, reason = create_stages(cfg)
        backend.load()
        self.backend = backend
        labels = load_labels(labels_path(cfg.model.path, cfg.model.labels))
        capture = open_capture(cfg.source)
        self.grabber = LatestFrameGrabber(capture, cfg.source.timeout_s).start()
        recorder = LatencyRecorder(cfg.runtime.budget_ms, cfg.runtime.latency_window)
        self.pipeline = Pipeline(self.grabber, preprocessor, backend, TopK(labels, cfg.runtime.top_k), recorder,
                                 self.extra_sinks, cfg.runtime.max_consecutive_errors)
        self.log("start", source=capture.description, preprocess=getattr(preprocessor, "name", "?"),
                 budget_ms=cfg.runtime.budget_ms, weights=self.model_info.get("weights"), chosen_because=reason,
                 **backend.describe())
        return self.pipeline

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
        if self.backend is not None:
            self.backend.close()


def run(cfg: Config, log: Optional[JsonLog] = None, stop: Optional[StopFlag] = None) -> Dict[str, Any]:
    """Run until `runtime.frames` frames, the end of the source, or a stop signal. Returns the final report."""
    runtime = Runtime(cfg, log)
    if stop is None:
        stop = StopFlag()
        stop.install()
    try:
        pipeline = runtime.start()
        runtime.warm_up()
        ended_by = "frames"
        while not cfg.runtime.frames or pipeline.recorder.frames < cfg.runtime.frames:
            if stop.event.is_set():
                ended_by = "signal {}".format(stop.signal)
                break
            try:
                result = pipeline.step()
            except SourceEnded:
                ended_by = "end of source"
                break
            if result.status == "error":
                runtime.log("frame_error", level="warning", frame=result.frame_id, seq=result.seq,
                            error=result.error)
            if pipeline.recorder.frames and pipeline.recorder.frames % cfg.runtime.report_every == 0 \
                    and result.status != "error":
                runtime.log("summary", **runtime.report())
        report = runtime.report()
        report["ended_by"] = ended_by
        runtime.log("report", **report)
        header = ["edge run: {} on {} - {}".format(runtime.backend.describe()["backend"], cfg.source.uri,
                                                   "trained weights" if runtime.trained else UNTRAINED_WARNING)]
        print(format_table(report, header), file=sys.stderr, flush=True)
        return report
    finally:
        runtime.close()
