"""edge.infer.pipeline: the batch-1 pipeline times every stage, counts a failed frame and raises after too many in a
row, on a real ONNX Runtime session and real video files (`edge run` end to end: test_cli_run.py)."""


import pytest
import service_helpers as sh
from service_helpers import ControlledBackend

from edge.config import SourceConfig, load_config
from edge.infer.latency import LatencyRecorder
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend
from edge.infer.pipeline import Pipeline, TooManyErrors
from edge.infer.postprocess import TopK, load_labels
from edge.infer.preprocess import CpuPreprocessor
from edge.infer.stages import Stages
from edge.sources.source import SourceEnded, open_capture
from edge.store.artifact import labels_path


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
