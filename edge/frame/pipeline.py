"""The batch-1 loop: frame -> preprocess -> infer -> postprocess -> sinks, every stage timed.

Data flows one way. Sinks (log, metrics, notify, demo overlay) see each Result after it is complete
and never feed back into the frame path.
"""

import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from edge.frame.capture import Frame
from edge.frame.latency import LatencyRecorder
from edge.frame.postprocess import Prediction
from edge.frame.stages import Stages


@dataclass
class Result:
    frame_id: int  # frames processed by this pipeline, from 1
    seq: int  # the source's sequence number
    stage_ms: Dict[str, float]
    prediction: Optional[Prediction]
    status: str  # ok | miss | error
    error: Optional[str]
    image: np.ndarray


class Sink:
    def on_result(self, result: Result) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


_DEVICE_TIMINGS = (("preprocess_gpu", "last_preprocess_ms"), ("infer_gpu", "last_infer_ms"))


class TooManyErrors(Exception):
    """More consecutive frame failures than `runtime.max_consecutive_errors`."""


class Pipeline:
    """Times one frame through the stages and hands the Result to the sinks. `stages` is one object, so a reload
    swaps the whole model (preprocess, backend, labels) between two frames."""

    def __init__(self, stages: Stages, recorder: LatencyRecorder, sinks: Optional[List[Sink]] = None,
                 max_consecutive_errors: int = 50):
        self.stages = stages
        self.recorder = recorder
        self.sinks = list(sinks or [])
        self.max_consecutive_errors = max_consecutive_errors
        self.frame_id = 0
        self.errors = 0
        self.consecutive_errors = 0

    def process(self, frame: Frame, record: bool = True) -> Result:
        stages = self.stages
        t0 = time.monotonic()
        try:
            tensor = stages.preprocess(frame.image)
            t1 = time.monotonic()
            logits = stages.backend.infer(tensor)
            t2 = time.monotonic()
            prediction = stages.postprocess(logits)
            t3 = time.monotonic()
        except Exception as exc:  # one bad frame must not stop the service
            self.errors += 1
            self.consecutive_errors += 1
            self.frame_id += 1
            result = Result(self.frame_id, frame.seq, {}, None, "error", "{}: {}".format(type(exc).__name__, exc),
                            frame.image)
            if self.consecutive_errors > self.max_consecutive_errors:
                raise TooManyErrors("{} consecutive frames failed, last: {}".format(
                    self.consecutive_errors, result.error)) from exc
            self._deliver(result)
            return result
        self.consecutive_errors = 0
        stage_ms = {
            "capture": frame.capture_ms,
            "frame_age": (t0 - frame.captured) * 1e3,
            "preprocess": (t1 - t0) * 1e3,
            "infer": (t2 - t1) * 1e3,
            "postprocess": (t3 - t2) * 1e3,
            "end_to_end": (t3 - frame.captured) * 1e3,
        }
        for stage, attribute in _DEVICE_TIMINGS:  # CUDA-event times of the GPU path's device work
            device_ms = getattr(stages.backend, attribute, None)
            if device_ms is not None:
                stage_ms[stage] = device_ms
        self.frame_id += 1
        missed = self.recorder.record(stage_ms) if record else False
        result = Result(self.frame_id, frame.seq, stage_ms, prediction, "miss" if missed else "ok", None, frame.image)
        if record:
            self._deliver(result)
        return result

    def _deliver(self, result: Result) -> None:
        for sink in self.sinks:
            sink.on_result(result)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
