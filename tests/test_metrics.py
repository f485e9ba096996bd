"""Prometheus metrics: scraped over HTTP on 127.0.0.1 and parsed with prometheus_client's own parser."""

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
import service_helpers as sh
from prometheus_client.parser import text_string_to_metric_families

from edge.infer.pipeline import Result
from edge.service.metrics import MetricsSink, budget_buckets
from edge.service.runtime import Runtime
from edge.service.signals import StopFlag
from edge.service.telemetry import TelemetrySnapshot
from edge.store.artifact import sha256_file

IMAGE = np.zeros((2, 2, 3), np.uint8)


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:{}/metrics".format(port), timeout=5) as resp:
        assert resp.status == 200
        return resp.read().decode()


def samples(text):
    """{(sample name, frozenset(labels)): value}"""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(parsed, name, **labels):
    return parsed[(name, frozenset(labels.items()))]


def result(frame_id, status, e2e_ms=10.0, infer_ms=6.0):
    stage_ms = {} if status == "error" else {"capture": 0.5, "frame_age": 1.0, "preprocess": 2.0,
                                             "infer": infer_ms, "postprocess": 0.2, "end_to_end": e2e_ms}
    return Result(frame_id, frame_id, stage_ms, None, status, "RuntimeError: x" if status == "error" else None,
                  IMAGE)


def test_buckets_are_dense_around_the_budget_and_include_it():
    b30 = budget_buckets(30.0)
    assert 0.03 in b30 and 0.0285 in b30 and 0.0315 in b30
    near = [b for b in b30 if 0.015 <= b <= 0.045]
    assert len(near) >= 10, "not dense around the budget"
    assert b30 == sorted(b30) and min(b30) < 0.001 and max(b30) >= 0.3
    b20 = budget_buckets(20.0)
    assert 0.02 in b20 and 0.019 in b20 and 0.021 in b20 and 0.0285 not in b20


def stages_serving(model_path, sha256):
    """What MetricsSink.serving reads of the Stages serving now."""
    return SimpleNamespace(description={"backend": "onnxruntime", "precision": "fp32"}, model_path=model_path,
                           sha256=sha256)


@pytest.fixture
def sink():
    stats = {"produced": 50, "skipped": 7, "broken": 1, "faults": 2, "reconnects": 2}
    snap = TelemetrySnapshot(time=time.time(), source="jtop", gpu_load=0.42, cpu_freq_mhz=1200.0,
                             gpu_freq_mhz=612.0, emc_freq_mhz=2133.0, temperatures={"cpu": 45.5, "gpu": 43.0},
                             power_w=6.65, ram_fraction=0.25, nvpmodel="MODE_15W", jetson_clocks=False)
    s = MetricsSink(30.0, source_stats=lambda: stats, telemetry=lambda: snap)
    port = s.serve("127.0.0.1", 0)
    yield s, port
    s.close()


def test_scrape_counts_the_delivered_frames(sink):
    s, port = sink
    assert s.server.server_address[0] == "127.0.0.1"
    s.serving(stages_serving("/m/model.onnx", "ab" * 32))
    e2e = [10.0, 20.0, 29.0, 31.0, 45.0, 29.99]
    for i, ms in enumerate(e2e, start=1):
        s.on_result(result(i, "miss" if ms > 30 else "ok", e2e_ms=ms))
    s.on_result(result(7, "error"))
    p = samples(scrape(port))
    assert value(p, "edge_frames_total", status="ok") == 4
    assert value(p, "edge_frames_total", status="miss") == 2
    assert value(p, "edge_frames_total", status="error") == 1
    assert value(p, "edge_deadline_misses_total") == 2
    # the SLO bucket: frames within the 30 ms budget
    assert value(p, "edge_frame_latency_seconds_bucket", le="0.03") == 4
    assert value(p, "edge_frame_latency_seconds_bucket", le="0.0285") == 2
    assert value(p, "edge_frame_latency_seconds_bucket", le="+Inf") == 6
    assert value(p, "edge_frame_latency_seconds_count") == 6
    assert value(p, "edge_frame_latency_seconds_sum") == pytest.approx(sum(e2e) / 1000)
    for stage in ("capture", "frame_age", "preprocess", "infer", "postprocess"):
        assert value(p, "edge_stage_duration_seconds_count", stage=stage) == 6  # errors carry no timings
    assert value(p, "edge_stage_duration_seconds_sum", stage="infer") == pytest.approx(0.036)
    assert value(p, "edge_stage_duration_seconds_bucket", stage="infer", le="0.006") == 6
    assert value(p, "edge_stage_duration_seconds_bucket", stage="infer", le="0.003") == 0
    assert ("edge_stage_duration_seconds_count", frozenset({("stage", "end_to_end")})) not in p
    assert value(p, "edge_budget_seconds") == 0.03
    assert value(p, "edge_dropped_frames_total") == 7
    assert value(p, "edge_source_reconnects_total") == 2 and value(p, "edge_source_faults_total") == 2
    assert value(p, "edge_engine_info", backend="onnxruntime", precision="fp32", model="model.onnx",
                 sha256="ab" * 32) == 1
    assert [k for k in p if k[0] == "edge_build_info"]
    # telemetry gauges, in base units
    assert value(p, "edge_gpu_load_ratio") == 0.42
    assert value(p, "edge_temperature_celsius", zone="cpu") == 45.5
    assert value(p, "edge_temperature_celsius", zone="gpu") == 43.0
    assert value(p, "edge_power_watts") == 6.65
    assert value(p, "edge_gpu_frequency_hertz") == 612e6 and value(p, "edge_emc_frequency_hertz") == 2133e6
    assert value(p, "edge_nvpmodel_info", mode="MODE_15W") == 1
    assert value(p, "edge_jetson_clocks_enabled") == 0 and value(p, "edge_telemetry_degraded") == 0
    assert value(p, "edge_ram_used_ratio") == 0.25


def test_the_per_class_counter_is_bounded_to_the_first_classes_seen_and_other(sink):
    """A 1000-class model cannot make 1000 series: MAX_CLASS_SERIES classes each, every later one as "other"."""
    from edge.infer.postprocess import Prediction
    from edge.service.metrics import MAX_CLASS_SERIES

    s, port = sink
    names = ["class{}".format(i) for i in range(MAX_CLASS_SERIES + 5)]
    for i, name in enumerate(names * 2 + ["class0"], start=1):
        r = result(i, "ok")
        r.prediction = Prediction([i], [0.9], [name])
        s.on_result(r)
    s.on_result(result(99, "error"))  # no prediction: not a class
    p = samples(scrape(port))
    series = {dict(k[1])["class"]: v for k, v in p.items() if k[0] == "edge_class_frames_total"}
    assert len(series) == MAX_CLASS_SERIES + 1 and series["class0"] == 3 and series["other"] == 10
    assert sum(series.values()) == len(names) * 2 + 1


def test_each_sink_has_its_own_registry(sink):
    s, port = sink
    other = MetricsSink(20.0)  # would raise "Duplicated timeseries" on a shared registry
    other.on_result(result(1, "ok"))
    s.on_result(result(1, "ok"))
    s.on_result(result(2, "ok"))
    assert other.registry is not s.registry
    assert value(samples(scrape(port)), "edge_frames_total", status="ok") == 2


def test_promtool_accepts_the_exposition(sink, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus; scripts/bootstrap.sh --dev as root)")
    s, port = sink
    s.serving(stages_serving("/m/model.onnx", "0" * 64))
    for i in range(5):
        s.on_result(result(i + 1, "ok"))
    text = scrape(port)
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          encoding="utf-8", errors="replace")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr  # no lint warnings


def test_a_busy_port_is_a_one_line_error():
    port = sh.free_port()
    first = MetricsSink(30.0)
    first.serve("127.0.0.1", port)
    try:
        with pytest.raises(Exception, match="cannot listen on 127.0.0.1:{}".format(port)):
            MetricsSink(30.0).serve("127.0.0.1", port)
    finally:
        first.close()


def test_runtime_serves_metrics_on_localhost_and_they_match_its_recorder(small_model):
    port = sh.free_port()
    cfg = sh.service_config(small_model, **{"service.metrics.enabled": True, "service.metrics.port": port,
                                            "service.telemetry.enabled": True, "runtime.budget_ms": 30.0})
    with Runtime(cfg, log=sh.ListLog()) as runtime:
        assert runtime.metrics.server.server_address[0] == "127.0.0.1"
        frames = runtime.frames(StopFlag())
        while runtime.pipeline.recorder.frames < 25:  # after the warm-up frames
            runtime.process(next(frames))
        skipped_before = runtime.source.stats()["skipped"]  # the source keeps reading while we scrape
        p = samples(scrape(port))
        skipped_after = runtime.source.stats()["skipped"]
        rec = runtime.pipeline.recorder
        assert rec.frames == 25
        assert value(p, "edge_frames_total", status="ok") + value(p, "edge_frames_total", status="miss") == 25
        assert value(p, "edge_deadline_misses_total") == rec.misses
        assert value(p, "edge_frame_latency_seconds_count") == 25
        e2e = rec.stages["end_to_end"].window()
        assert value(p, "edge_frame_latency_seconds_bucket", le="0.03") == int((e2e <= 30.0).sum())
        assert value(p, "edge_frame_latency_seconds_sum") == pytest.approx(e2e.sum() / 1000, rel=1e-6)
        assert skipped_before <= value(p, "edge_dropped_frames_total") <= skipped_after
        assert value(p, "edge_engine_info", backend="onnxruntime", precision="fp32",
                     model=os.path.basename(small_model), sha256=sha256_file(small_model)) == 1
        assert value(p, "edge_telemetry_source_info", source=runtime.telemetry.latest().source) == 1
        assert value(p, "edge_ram_used_ratio") > 0
    with pytest.raises(OSError):
        scrape(port)  # closed with the runtime


def healthz(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:{}/healthz".format(port), timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_says_whether_a_frame_completed_within_the_window():
    s = MetricsSink(30.0, stale_after_s=2.0)
    port = s.serve("127.0.0.1", 0)
    try:
        assert healthz(port) == (503, "no frame completed yet\n")
        s.on_result(result(1, "error"))  # a failed frame is not a completed one
        assert healthz(port)[0] == 503
        s.on_result(result(2, "miss", e2e_ms=45.0))  # late, but completed
        status, body = healthz(port)
        assert status == 200 and body.startswith("ok: last frame") and body.count("\n") == 1
        assert sh.wait_until(lambda: healthz(port)[0] == 503, 60)  # no frame since: stale
        status, body = healthz(port)
        assert status == 503 and body.startswith("no frame completed for ") and body.endswith("(limit 2 s)\n")
        assert "edge_frames_total" in scrape(port)  # /metrics unchanged beside it
    finally:
        s.close()
    assert MetricsSink(30.0).stale_after_s == 10.0  # the default, as documented


def test_healthz_and_a_gauge_say_why_the_service_runs_degraded():
    why = []
    s = MetricsSink(30.0, degraded=lambda: why[0] if why else None)
    port = s.serve("127.0.0.1", 0)
    try:
        s.on_result(result(1, "miss", e2e_ms=45.0))
        assert healthz(port)[1].startswith("ok: last frame") and value(samples(scrape(port)), "edge_degraded") == 0
        why.append("overloaded: no frame can make the 30 ms budget")
        status, body = healthz(port)  # still serving (best effort): 200, with the reason first
        assert status == 200 and body.startswith("degraded: overloaded: no frame can make the 30 ms budget; ok: ")
        assert value(samples(scrape(port)), "edge_degraded") == 1
    finally:
        s.close()


def test_process_resident_memory_is_exported_for_the_memory_growth_alert(sink):
    s, port = sink
    rss = value(samples(scrape(port)), "process_resident_memory_bytes")
    assert rss > 10e6


def test_throttle_signals_are_exported_in_base_units():
    snap = TelemetrySnapshot(time=time.time(), source="jtop", cpu_freq_max_mhz=2035.2, gpu_freq_max_mhz=921.6,
                             overcurrent={"VDD_IN": True, "VDD_CPU_GPU_CV": False})
    s = MetricsSink(30.0, telemetry=lambda: snap)
    port = s.serve("127.0.0.1", 0)
    try:
        p = samples(scrape(port))
    finally:
        s.close()
    assert value(p, "edge_cpu_frequency_max_hertz") == pytest.approx(2035.2e6)
    assert value(p, "edge_gpu_frequency_max_hertz") == pytest.approx(921.6e6)
    assert value(p, "edge_power_rail_overcurrent", rail="VDD_IN") == 1
    assert value(p, "edge_power_rail_overcurrent", rail="VDD_CPU_GPU_CV") == 0


def test_a_reload_is_told_to_every_service_part(small_model, tmp_path):
    """The runtime tells each service part the same things: metrics count the reloads and name the model that
    serves, a reloadable runtime key reaches the pipeline (its applier), the log tags untrained weights."""
    port = sh.free_port()
    served = {"service.metrics.enabled": True, "service.metrics.port": port}
    b = sh.copy_model(small_model, tmp_path, "b")
    configs = iter([sh.service_config(b, **served, **{"runtime.max_consecutive_errors": 7}),
                    sh.service_config(str(tmp_path / "missing.onnx"), **served)])
    log = sh.ListLog()
    with Runtime(sh.service_config(small_model, **served), log=log, reload_config=lambda: next(configs)) as rt:
        assert rt.pipeline.max_consecutive_errors == 50
        assert rt.reload() and not rt.reload()
        p = samples(scrape(port))
        assert value(p, "edge_reloads_total", result="ok") == 1 and value(p, "edge_reloads_total", result="failed") == 1
        assert value(p, "edge_engine_info", backend="onnxruntime", precision="fp32", model="b.onnx",
                     sha256=sha256_file(b)) == 1
        assert rt.pipeline.max_consecutive_errors == 7
        assert "UNTRAINED" in log.extra["warning"]  # on every line: b's weights are random, as small_model's
