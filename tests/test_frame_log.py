"""edge.service.frame_log: a miss names the stage that overran, a flood of misses is rate-limited and counted, and
the rate limit itself is a pure policy (tested on a fake clock)."""

import pytest
import service_helpers as sh

from edge.service.frame_log import FrameLogSink, RateLimit
from edge.service.telemetry import Telemetry


def test_a_miss_names_the_stage_that_overran_and_the_telemetry(small_model, monkeypatch):
    """Every 10th inference sleeps 0.4 s against a 250 ms budget: those misses name `infer`, however loaded the
    machine (a loaded frame may miss too, and then names its own stage)."""
    monkeypatch.setattr(Telemetry, "wants_jtop", lambda self: False)  # as off-Jetson: another worker's test may
    # be running jetson-stats' service (tests/service_jtop.py), whose first sample comes later than Linux's
    backend = sh.ControlledBackend(small_model, slow_every=10, slow_s=0.4)
    log = sh.ListLog()
    cfg = sh.service_config(small_model, **{"runtime.frames": 50, "runtime.budget_ms": 250.0,
                                            "service.telemetry.enabled": True, "runtime.report_every": 25})
    report, runtime = sh.run_in_process(cfg, log, stages_factory=sh.stages_with(backend))
    misses = log.events("frame_miss")
    suppressed = frame_log(runtime).lines.suppressed_total
    assert len(misses) + suppressed == report["misses"]  # each miss logged, or counted beyond the rate limit
    slow = [m for m in misses if m["stage_ms"]["infer"] >= 400]
    assert len(slow) >= 4
    for m in slow:
        assert m["worst_stage"] == "infer" and m["end_to_end_ms"] > 250 and m["budget_ms"] == 250.0
        assert m["worst_stage_over_p50_ms"] == pytest.approx(m["stage_ms"]["infer"] - m["worst_stage_p50_ms"], abs=0.01)
        assert m["telemetry"]["source"] == "linux" and "ram_fraction" in m["telemetry"]
        assert m["top1"]["label"] and 0 < m["top1"]["score"] <= 1  # what the missed frame was classified as
    assert not log.events("frame_ok")  # ok frames are not logged one by one
    summaries = log.events("summary")
    assert [s["frames"] for s in summaries] == [25, 50] and "telemetry" in summaries[0]
    assert sum(c["frames"] for c in summaries[0]["top_classes"]) <= 25 and report["top_classes"][0]["frames"] > 0


def frame_log(runtime):
    return next(sink for sink in runtime.sinks if isinstance(sink, FrameLogSink))


def test_a_flood_of_misses_is_rate_limited_and_counted(small_model):
    log = sh.ListLog()
    cfg = sh.service_config(small_model, **{"runtime.frames": 80, "runtime.budget_ms": 0.001,
                                            "source.fps": 200.0})
    report, runtime = sh.run_in_process(cfg, log)
    lines = log.events("frame_miss")
    suppressed = frame_log(runtime).lines.suppressed_total
    assert report["misses"] == 80
    assert len(lines) < 80 and len(lines) + suppressed == 80
    assert sum(m["suppressed"] for m in lines) <= suppressed


def test_the_rate_limit_allows_its_lines_a_second_and_counts_the_rest_on_a_fake_clock():
    limit = RateLimit(per_s=3)
    assert [limit.allow(100.0 + 0.1 * i) for i in range(5)] == [True, True, True, False, False]
    assert limit.take_suppressed() == 2 and limit.take_suppressed() == 0  # told once, with the next line
    assert limit.allow(100.99) is False and limit.allow(101.0) is True  # a new second, a new window
    assert limit.suppressed_total == 3 and limit.take_suppressed() == 1
