"""One frame through the stages (Stages.classify: preprocess -> infer -> postprocess), every stage timed, into a
Result that carries what sinks report; or one batch of several cameras' frames (Stages.classify_batch), one
Result per frame. Data flows one way: the Runtime (edge/service/runtime.py) hands each
Result to the sinks (log, metrics, notify, demo overlay, check series), which never feed back.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from edge.infer.latency import LatencyRecorder
from edge.infer.postprocess import ClassCounts, Prediction
from edge.infer.stages import Stages


@dataclass
class Frame:
    image: np.ndarray  # HxWx3 uint8 BGR
    seq: int  # 1, 2, 3... in capture order; a gap between two frames the pipeline saw = skipped frames
    captured: float  # time.monotonic() when the frame was in memory
    capture_ms: float  # time spent in the read (decode for files and streams)


@dataclass
class Result:
    """One frame, complete: its timing and prediction, and the counters sinks report (no sink asks the runtime)."""

    frame_id: int  # frames processed by this pipeline, from 1
    seq: int  # the source's sequence number
    stage_ms: Dict[str, float]
    prediction: Optional[Prediction]
    status: str  # ok | miss | error
    error: Optional[str]
    image: np.ndarray
    frames: int = 0  # timed frames so far (warm-up frames are not)
    misses: int = 0
    errors: int = 0  # failed frames so far
    consecutive_errors: int = 0
    source: Dict[str, int] = field(default_factory=dict)  # the cameras' counters, summed (Cameras.stats)
    telemetry: Any = None  # the latest TelemetrySnapshot, when telemetry runs
    reloads: Dict[str, int] = field(default_factory=dict)  # SIGHUP reloads: ok, failed
    camera: str = ""  # several cameras: the one this frame is from (sources[].name)
    batch: int = 1  # frames in the batch this one was served in
    cameras: Dict[str, Dict[str, int]] = field(default_factory=dict)  # several cameras: each one's counters
    classes: Optional[ClassCounts] = None  # the timed frames' top-1 classes so far


class Sink:
    """Sees each delivered Result (timed frames and failed ones) after it is complete; never feeds back."""

    def on_result(self, result: Result) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TooManyErrors(Exception):
    """More consecutive frame failures than `runtime.max_consecutive_errors`."""


class Pipeline:
    """Times one frame through the stages. `stages` is one object, so a reload swaps the whole model
    (preprocess, backend, labels) between two frames."""

    def __init__(self, stages: Stages, recorder: LatencyRecorder, max_consecutive_errors: int = 50):
        self.stages = stages
        self.recorder = recorder
        self.max_consecutive_errors = max_consecutive_errors
        self.frame_id = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.classes = ClassCounts()

    def process(self, frame: Frame, record: bool = True) -> Result:
        """One frame's Result; `record=False` (warm-up) times the frame without recording it."""
        return self.process_batch([frame], [""], 1 if record else 0)[0]

    def process_batch(self, frames: Sequence[Frame], cameras: Sequence[str], timed: int) -> List[Result]:
        """Frames (`cameras[i]` names frames[i]'s camera) as one batch: a Result each, in order, the first `timed` of
        them recorded. Each frame's frame_age is its wait from capture to the batch's start; its other stages are the
        batch's. A batch of one is Stages.classify (no batch rows)."""
        t0 = time.monotonic()
        batch_ms: Dict[str, float] = {}
        try:
            if len(frames) == 1:
                predictions = [self.stages.classify(frames[0].image, batch_ms)]
            else:
                predictions = self.stages.classify_batch([f.image for f in frames], batch_ms)
        except Exception as exc:  # one bad frame or batch must not stop the service: each frame counts as failed
            return [self._failed_frame(frame, camera, exc, len(frames)) for frame, camera in zip(frames, cameras)]
        self.consecutive_errors = 0
        end = time.monotonic()
        results = []
        for i, (frame, camera, prediction) in enumerate(zip(frames, cameras, predictions)):
            self.frame_id += 1
            stage_ms = dict(capture=frame.capture_ms, frame_age=(t0 - frame.captured) * 1e3, **batch_ms)
            stage_ms["end_to_end"] = (end - frame.captured) * 1e3
            missed = self.recorder.record(stage_ms) if i < timed else False
            if i < timed:
                self.classes.add(prediction)
            results.append(self._result(frame, stage_ms, prediction, "miss" if missed else "ok", None, camera,
                                        len(frames)))
        return results

    def _failed_frame(self, frame: Frame, camera: str, exc: Exception, batch: int) -> Result:
        self.frame_id += 1
        return self._result(frame, {}, None, "error", self._failed(exc), camera, batch)

    def _failed(self, exc: Exception) -> str:
        """Count a failed frame; its error line, or TooManyErrors past `max_consecutive_errors` in a row."""
        self.errors += 1
        self.consecutive_errors += 1
        error = "{}: {}".format(type(exc).__name__, exc)
        if self.consecutive_errors > self.max_consecutive_errors:
            raise TooManyErrors("{} consecutive frames failed, last: {}".format(
                self.consecutive_errors, error)) from exc
        return error

    def _result(self, frame: Frame, stage_ms: Dict[str, float], prediction: Optional[Prediction], status: str,
                error: Optional[str], camera: str = "", batch: int = 1) -> Result:
        return Result(self.frame_id, frame.seq, stage_ms, prediction, status, error, frame.image,
                      self.recorder.frames, self.recorder.misses, self.errors, self.consecutive_errors,
                      camera=camera, batch=batch, classes=self.classes)
