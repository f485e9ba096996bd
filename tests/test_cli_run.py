"""edge.cli.run (`edge run`) end to end: on a video file, the CPU fallback said, the end of a file and the frame count,
SIGINT, repeated failures (exit 1, one line), and what stdout says with --json, without, and under the journal."""

import signal
import subprocess
import sys

import numpy as np
import onnx
import service_helpers as sh
from service_helpers import JsonLines, json_lines, write_config

from conftest import REPO, run_edge


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


def test_a_file_without_loop_ends_normally(small_model, video_file, tmp_path):
    cfg = sh.write_config(tmp_path / "cfg.yaml", {"source": {"uri": video_file, "loop": False, "fps": 30},
                                                  "runtime": {"warmup": 2}, "backend": sh.QUIET_ORT,
                                                  "service": {"telemetry": {"enabled": False}}})
    proc = run_edge("run", "--config", cfg, "--model", small_model, "--backend", "onnxruntime",
                    "--preprocess", "cpu")
    assert proc.returncode == 0, proc.stderr
    report = sh.json_lines(proc.stdout)[-1]
    assert report["event"] == "report" and report["ended_by"] == "end of source"
    assert report["faults"] == 0 and report["reconnects"] == 0  # a file is not a camera: no reconnects
    assert 0 < report["frames"] <= 30


def _bad_shape_model(path):
    """A valid ONNX model that loads (on the blank input load runs, sqrt(-x*x) is 0) but gives NaN on every real
    frame (any pixel off the mean makes -x*x negative): every frame fails in top-k."""
    from onnx import TensorProto, helper, numpy_helper

    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2])
    weight = numpy_helper.from_array(np.ones((3, 2), np.float32), "w")
    nodes = [helper.make_node("Mul", ["input", "input"], ["square"]), helper.make_node("Neg", ["square"], ["neg"]),
             helper.make_node("Sqrt", ["neg"], ["root"]),
             helper.make_node("ReduceMean", ["root"], ["mean"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["mean", "w"], ["logits"])]
    graph = helper.make_graph(nodes, "bad", [inp], [out], initializer=[weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    (path.parent / (path.stem + ".labels.txt")).write_text("a\nb\n", encoding="utf-8")
    return str(path)


def test_repeated_failures_exit_1_with_one_error_line(tmp_path):
    model = _bad_shape_model(tmp_path / "bad.onnx")
    cfg = sh.write_config(tmp_path / "cfg.yaml", {"runtime": {"max_consecutive_errors": 3},
                                                  "source": {"width": 96, "height": 72}, "backend": sh.QUIET_ORT,
                                                  "service": {"telemetry": {"enabled": False}}})
    proc = run_edge("run", "--config", cfg, "--model", model, "--backend", "onnxruntime", "--preprocess", "cpu")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("edge run: error: 4 consecutive frames failed, last: ")
    lines = sh.json_lines(proc.stdout)
    assert [r["event"] for r in lines].count("frame_error") == 3  # the 4th is the exit line itself
    report = lines[-1]
    assert report["event"] == "report" and report["ended_by"] == "too many errors" and report["level"] == "error"


def test_edge_run_prints_each_miss_only_with_json_or_in_the_journal(small_model):
    """Command 1 on a loaded machine: every frame misses a 0.001 ms budget. Without --json, stdout has the start,
    summaries and the report (no frame_miss line), with one `overload` warning saying why every result is late, and
    the table on stderr says what was classified."""
    args = ("run", "--model", small_model, "--source", "synthetic", "--frames", 20, "--budget-ms", 0.001,
            "--backend", "onnxruntime", "--preprocess", "cpu")
    plain, verbose = run_edge(*args), run_edge(*args, "--json")
    journal = run_edge(*args, env={"JOURNAL_STREAM": "8:1"})
    for proc in (plain, verbose, journal):
        assert proc.returncode == 0, proc.stderr
    events = [r["event"] for r in sh.json_lines(plain.stdout)]  # a loaded machine may add a source_timeout
    assert events[0] == "start" and events[-1] == "report" and "frame_miss" not in events, events
    overload = [r for r in sh.json_lines(plain.stdout) if r["event"] == "overload"]
    assert len(overload) == 1 and "over the 0.001 ms budget" in overload[0]["reason"], events
    report = sh.json_lines(plain.stdout)[-1]
    assert report["misses"] == 20 and sum(c["frames"] for c in report["top_classes"]) == 20
    assert "classified (top-1): {} ".format(report["top_classes"][0]["label"]) in plain.stderr
    for proc in (verbose, journal):
        misses = [r for r in sh.json_lines(proc.stdout) if r["event"] == "frame_miss"]
        assert misses and all(m["top1"]["label"] for m in misses)
