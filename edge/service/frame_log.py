"""What a frame deserves in the log: misses and errors one line each (rate-limited, misses naming the stage
that overran most against its recent p50 and what the frame was classified as) and a summary every
`runtime.report_every` timed frames, with the classes most often top-1 (`top_classes`, as the final report).

Frames that meet the budget are not logged one by one: at 30 fps that would flood the journal; they are in
the summaries and the Prometheus histograms. Beyond `MAX_FRAME_LINES_PER_S` lines a second, misses and errors
are only counted (`suppressed`) and still in the metrics.
"""

import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from edge.infer.latency import STACKED, LatencyRecorder
from edge.infer.pipeline import Result, Sink
from edge.infer.postprocess import ClassCounts

MAX_FRAME_LINES_PER_S = 10  # frame_miss + frame_error lines per second before they are only counted
P50_REFRESH_FRAMES = 64  # recompute the per-stage p50 used to name a miss's culprit this often
TOP_CLASSES = 3  # the most frequent top-1 classes a summary and the final report name


class RateLimit:
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


def report_fields(recorder: LatencyRecorder, source: Dict[str, int], errors: int, reloads: Dict[str, int],
                  telemetry: Any, classes: Optional[ClassCounts] = None) -> Dict[str, Any]:
    """What the periodic summary line and the final report say: latency statistics, every counter and the classes
    most often top-1."""
    out: Dict[str, Any] = recorder.summary()
    out.update(source, errors=errors, reloads=dict(reloads),
               telemetry=telemetry.brief() if telemetry is not None else None)
    if classes is not None:
        out["top_classes"] = classes.top(TOP_CLASSES)
    return out


class FrameLogSink(Sink):
    """Logs through `event(name, level, **fields)`, with the counters each Result carries."""

    def __init__(self, event: Callable[..., None], recorder: LatencyRecorder, budget_ms: float, report_every: int):
        self.event = event
        self.recorder = recorder
        self.budget_ms = budget_ms
        self.report_every = report_every
        self.lines = RateLimit(MAX_FRAME_LINES_PER_S)
        self._p50: Dict[str, float] = {}
        self._p50_at = -P50_REFRESH_FRAMES

    def _recent_p50(self) -> Dict[str, float]:
        recorder = self.recorder
        if recorder.frames - self._p50_at >= P50_REFRESH_FRAMES:
            self._p50 = {name: float(np.percentile(recorder.stages[name].window(), 50))
                         for name in STACKED if name in recorder.stages and recorder.stages[name].count}
            self._p50_at = recorder.frames
        return self._p50

    def culprit(self, stage_ms: Dict[str, float]) -> Tuple[str, float, float]:
        """(stage, ms over its recent p50, that p50) for the stage that overran most."""
        p50 = self._recent_p50()
        best, best_over = "end_to_end", -float("inf")
        for name in STACKED:
            if name in stage_ms:
                over = stage_ms[name] - p50.get(name, 0.0)
                if over > best_over:
                    best, best_over = name, over
        return best, best_over, p50.get(best, 0.0)

    def on_result(self, result: Result) -> None:
        now = time.monotonic()
        if result.status == "miss" and self.lines.allow(now):
            stage, over, p50 = self.culprit(result.stage_ms)
            snap = result.telemetry
            self.event("frame_miss", level="warning", frame=result.frame_id, seq=result.seq, status="miss",
                       **({"camera": result.camera, "batch": result.batch} if result.camera else {}),
                       end_to_end_ms=round(result.stage_ms["end_to_end"], 3), budget_ms=self.budget_ms,
                       top1=result.prediction.top1() if result.prediction is not None else None,
                       stage_ms={k: round(v, 3) for k, v in result.stage_ms.items()}, worst_stage=stage,
                       worst_stage_over_p50_ms=round(over, 3), worst_stage_p50_ms=round(p50, 3),
                       suppressed=self.lines.take_suppressed(), telemetry=snap.brief() if snap is not None else None)
        elif result.status == "error" and self.lines.allow(now):
            error = result.error or ""
            self.event("frame_error", level="warning", frame=result.frame_id, seq=result.seq, status="error",
                       **({"camera": result.camera} if result.camera else {}),
                       error_type=error.split(":", 1)[0], error=error, consecutive=result.consecutive_errors,
                       suppressed=self.lines.take_suppressed())
        if result.frames and result.frames % self.report_every == 0 and result.status != "error":
            fields = report_fields(self.recorder, result.source, result.errors, result.reloads, result.telemetry,
                                   result.classes)
            if result.cameras:  # several cameras: each one's counters
                fields["cameras"] = result.cameras
            self.event("summary", frame_lines_suppressed=self.lines.suppressed_total, **fields)
