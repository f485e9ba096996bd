"""Per-stage latency statistics in bounded memory.

Each stage keeps the last `window` samples in a ring buffer (percentiles are exact over that window)
plus running count/sum/max over the whole run. A budget miss is a frame whose capture->result time
exceeds the budget.
"""

from typing import Dict, List

import numpy as np

PERCENTILES = (50, 90, 99)
# Stages in frame order; end_to_end is capture -> result, frame_age is capture -> pipeline start.
STAGES = ("capture", "frame_age", "preprocess", "infer", "postprocess", "end_to_end")
STACKED = STAGES[1:5]  # the parts of end_to_end, in order (it is their sum, plus timer gaps)


class StageStats:
    def __init__(self, window: int):
        self.samples = np.zeros(window, np.float64)
        self.next = 0
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, ms: float) -> None:
        self.samples[self.next] = ms
        self.next = (self.next + 1) % self.samples.shape[0]
        self.count += 1
        self.total += ms
        if ms > self.max:
            self.max = ms

    def window(self) -> np.ndarray:
        return self.samples[:min(self.count, self.samples.shape[0])]

    def summary(self) -> Dict[str, float]:
        if self.count == 0:
            return {}
        p = np.percentile(self.window(), PERCENTILES)
        out = {"p{}".format(q): round(float(v), 3) for q, v in zip(PERCENTILES, p)}
        out.update(max=round(self.max, 3), mean=round(self.total / self.count, 3))
        return out


class LatencyRecorder:
    def __init__(self, budget_ms: float, window: int = 4096):
        self.budget_ms = budget_ms
        self.window = window
        self.stages = {name: StageStats(window) for name in STAGES}
        self.frames = 0
        self.misses = 0

    def record(self, stage_ms: Dict[str, float]) -> bool:
        """Record one frame's stage times (ms); returns True when the frame missed the budget."""
        for name, ms in stage_ms.items():
            stats = self.stages.get(name)
            if stats is None:  # e.g. the GPU path's CUDA-event stages
                stats = self.stages[name] = StageStats(self.window)
            stats.add(ms)
        self.frames += 1
        missed = stage_ms["end_to_end"] > self.budget_ms
        self.misses += missed
        return missed

    def summary(self) -> Dict[str, object]:
        return {
            "frames": self.frames,
            "budget_ms": self.budget_ms,
            "misses": self.misses,
            "miss_rate": round(self.misses / self.frames, 5) if self.frames else 0.0,
            "window": min(self.frames, self.window),
            "stages_ms": {name: s.summary() for name, s in self.stages.items() if s.count},
        }


def format_table(summary: Dict[str, object], header: List[str]) -> str:
    """A trtexec-like summary: one row per stage, percentiles in ms, then misses against the budget."""
    lines = list(header)
    lines.append("{:<12}{:>9}{:>9}{:>9}{:>9}{:>9}".format("stage (ms)", "p50", "p90", "p99", "max", "mean"))
    stages = summary["stages_ms"]
    assert isinstance(stages, dict)
    for name, s in stages.items():
        lines.append("{:<12}{:>9.3f}{:>9.3f}{:>9.3f}{:>9.3f}{:>9.3f}".format(
            name, s["p50"], s["p90"], s["p99"], s["max"], s["mean"]))
    lines.append("budget {:g} ms: {} of {} frames missed ({:.2%})".format(
        summary["budget_ms"], summary["misses"], summary["frames"], summary["miss_rate"]))
    top = summary.get("top_classes")
    if isinstance(top, list) and top:  # what a run classified (edge.service.frame_log.report_fields)
        lines.append("classified (top-1): " + ", ".join("{} {:.1%} ({})".format(c["label"], c["share"], c["frames"])
                                                      for c in top))
    return "\n".join(lines)
