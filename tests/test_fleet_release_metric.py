"""What the fleet reads from each device's scrape: the deployed release and what its engine is tied to
(edge_build_info), per-stage buckets fine enough for a sub-millisecond stage, and no `_created` series."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edge.infer.pipeline import Result
from edge.service.metrics import MetricsSink


def scrape(sink):
    return {s.name: s for f in text_string_to_metric_families(generate_latest(sink.registry).decode())
            for s in f.samples if s.name != "edge_stage_duration_seconds_bucket"}, \
        [s for f in text_string_to_metric_families(generate_latest(sink.registry).decode()) for s in f.samples
         if s.name == "edge_stage_duration_seconds_bucket"]


def test_build_info_carries_the_release_and_the_board(monkeypatch):
    monkeypatch.setenv("EDGE_RELEASE", "0.2.0-model7")
    samples, _ = scrape(MetricsSink(30.0))
    labels = samples["edge_build_info"].labels
    assert labels["release"] == "0.2.0-model7"
    assert {"board", "l4t", "tensorrt", "version", "python"} <= set(labels)
    monkeypatch.delenv("EDGE_RELEASE")
    assert scrape(MetricsSink(30.0))[0]["edge_build_info"].labels["release"] == ""


def test_stage_buckets_resolve_sub_millisecond_stages_and_no_created_series():
    sink = MetricsSink(30.0)
    stage_ms = {"capture": 0.05, "frame_age": 1.0, "preprocess": 2.0, "infer": 8.0, "postprocess": 0.3,
                "end_to_end": 12.0}
    for i in range(4):
        sink.on_result(Result(i, i, stage_ms, None, "ok", None, None))
    samples, buckets = scrape(sink)
    post = {float(b.labels["le"]): b.value for b in buckets if b.labels["stage"] == "postprocess"}
    assert post[0.0002] == 0 and post[0.0005] == 4  # 0.3 ms falls between two buckets, not in the first
    assert not [name for name in samples if name.endswith("_created")]
