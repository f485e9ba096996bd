"""The batch-1 pipeline and `edge run` end to end on a real ONNX Runtime session and real video files."""

import signal
import subprocess
import sys

import pytest
import service_helpers as sh
from service_helpers import ControlledBackend, JsonLines, json_lines, write_config

from edge.config import SourceConfig, load_config
from edge.infer.latency import LatencyRecorder
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend
from edge.infer.pipeline import Pipeline, TooManyErrors
from edge.infer.postprocess import TopK, load_labels
from edge.infer.preprocess import CpuPreprocessor
from edge.infer.stages import Stages
from edge.sources.source import SourceEnded, open_capture
from edge.store.artifact import labels_path

from conftest import REPO, run_edge


def make_pipeline(model, video, backend=None, max_errors=50, loop=True):
    cfg = load_config(None)
    loaded = (backend or OnnxRuntimeBackend(model)).load()
    reader = sh.CameraReader(open_capture(SourceConfig(uri=video, fps=1000, loop=loop)))
    labels = load_labels(labels_path(model))
    stages = Stages(CpuPreprocessor(cfg.preprocess), loaded, TopK(labels), "test", model)
    return Pipeline(stages, LatencyRecorder(30.0), max_errors), reader


def test_pipeline_times_every_stage(small_model, video_file):
    pipeline, reader = make_pipeline(small_model, video_file, loop=False)
    results = []
    try:
        while True:
            results.append(pipeline.process(reader.get()))
    except SourceEnded:
        pass
    finally:
        reader.stop()
    assert results and all(r.status in ("ok", "miss") for r in results)
    r = results[-1]
    assert set(r.stage_ms) == {"capture", "frame_age", "preprocess", "infer", "postprocess", "end_to_end"}
    assert r.stage_ms["end_to_end"] >= r.stage_ms["preprocess"] + r.stage_ms["infer"] + r.stage_ms["postprocess"]
    assert len(r.prediction.labels) == 5
    assert pipeline.recorder.frames == len(results)


def test_a_failed_frame_is_counted_and_the_loop_continues(small_model, video_file):
    pipeline, reader = make_pipeline(small_model, video_file, ControlledBackend(small_model, fail_every=3))
    statuses = []
    try:
        for _ in range(9):
            statuses.append(pipeline.process(reader.get()).status)
    finally:
        reader.stop()
    assert statuses.count("error") == 3 and pipeline.errors == 3
    assert pipeline.recorder.frames == 6


def test_too_many_consecutive_failures_raise(small_model, video_file):
    failing = ControlledBackend(small_model, fail_every=1)
    pipeline, reader = make_pipeline(small_model, video_file, failing, max_errors=2)
    try:
        pipeline.process(reader.get())
        pipeline.process(reader.get())
        with pytest.raises(TooManyErrors, match="3 consecutive frames failed"):
            pipeline.process(reader.get())
    finally:
        reader.stop()


def test_edge_run_on_a_video_file(small_model, video_file):
    proc = run_edge("run", "--model", small_model, "--source", video_file, "--frames", 20,
                    "--backend", "onnxruntime", "--preprocess", "cpu")
    assert proc.returncode == 0, proc.stderr
    lines = json_lines(proc.stdout)
    assert lines[0]["event"] == "start" and lines[0]["backend"] == "onnxruntime"
    report = lines[-1]
    assert report["event"] == "report" and report["frames"] == 20
    stages = report["stages_ms"]  # each frame's capture -> result contains its forward pass, which takes time
    assert stages["end_to_end"]["p99"] >= stages["infer"]["p99"] > 0
    # random weights: every line says so, and so does the human report
    assert all("UNTRAINED" in line["warning"] for line in lines)
    assert "UNTRAINED WEIGHTS" in proc.stderr and "end_to_end" in proc.stderr


def test_edge_run_auto_falls_back_to_cpu_and_says_why(small_model, video_file):
    proc = run_edge("run", "--model", small_model, "--source", video_file, "--frames", 3)
    assert proc.returncode == 0, proc.stderr
    start = json_lines(proc.stdout)[0]
    assert start["backend"] == "onnxruntime" and start["preprocess"] == "cpu"
    assert start["chosen_because"]


def test_sigint_finishes_with_a_report(small_model, tmp_path):
    config = write_config(tmp_path / "run.yaml", {
        "model": {"path": small_model}, "source": {"uri": "synthetic"}, "backend": {"kind": "onnxruntime"},
        "preprocess": {"device": "cpu"}, "runtime": {"report_every": 1, "warmup": 1}})
    proc = subprocess.Popen([sys.executable, "-m", "edge", "run", "--config", config], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8", errors="replace")
    try:
        out = JsonLines(proc)
        out.wait_for("summary", timeout=60)  # a timed frame is through (a summary line per frame)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        out.thread.join(10)
    finally:
        proc.kill()
    assert proc.returncode == 0, proc.stderr.read()
    report = out.records[-1]
    assert report["event"] == "report" and report["ended_by"] == "signal 2" and report["frames"] > 0
