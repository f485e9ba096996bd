import numpy as np

from edge.infer.latency import STAGES, LatencyRecorder, format_table


def frame(ms):
    return {name: ms for name in STAGES}


def test_percentiles_match_numpy():
    data = np.random.default_rng(1).gamma(2.0, 3.0, 1000)
    rec = LatencyRecorder(budget_ms=30, window=4096)
    for v in data:
        rec.record(frame(float(v)))
    s = rec.summary()["stages_ms"]["infer"]
    for q in (50, 90, 99):
        assert s["p{}".format(q)] == round(float(np.percentile(data, q)), 3)
    assert s["max"] == round(float(data.max()), 3)
    assert s["mean"] == round(float(data.mean()), 3)


def test_misses_counted_against_budget():
    rec = LatencyRecorder(budget_ms=10)
    results = [rec.record(frame(v)) for v in (5, 9.99, 10.0, 10.01, 50)]
    assert results == [False, False, False, True, True]
    s = rec.summary()
    assert s["misses"] == 2 and s["frames"] == 5 and s["miss_rate"] == 0.4


def test_memory_is_bounded_and_window_is_the_latest_frames():
    rec = LatencyRecorder(budget_ms=30, window=100)
    for v in range(10000):
        rec.record(frame(float(v)))
    stats = rec.stages["end_to_end"]
    assert stats.samples.shape == (100,)
    assert sorted(stats.window()) == list(range(9900, 10000))
    s = rec.summary()
    assert s["frames"] == 10000 and s["window"] == 100
    assert s["stages_ms"]["end_to_end"]["p50"] == round(float(np.percentile(np.arange(9900, 10000), 50)), 3)
    assert s["stages_ms"]["end_to_end"]["mean"] == round(float(np.mean(np.arange(10000))), 3)


def test_table_lists_every_stage():
    rec = LatencyRecorder(budget_ms=30)
    rec.record(frame(1.0))
    table = format_table(rec.summary(), ["title"])
    assert table.splitlines()[0] == "title"
    for name in STAGES:
        assert any(line.startswith(name) for line in table.splitlines())
    assert "0 of 1 frames missed" in table
