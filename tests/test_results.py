"""The result sink (`service.results.path`, edge/service/results.py): every delivered frame's result as one JSON line
to a file or a FIFO another program reads; a FIFO without reader drops lines and never stalls the frame path."""

import json
import os
import threading

import service_helpers as sh
from test_model_info import colour_model

from edge.service.loop import run
from edge.service.results import ResultsSink
from edge.service.runtime import Runtime
from edge.service.signals import StopFlag

from conftest import assert_refused, edge_here


def red_model_config(tmp_path, results, **more):
    """The colour model on synthetic frames, results written to `results`."""
    model = colour_model(tmp_path / "colours.onnx")
    assert edge_here("model", "add", model, "--mean", "0,0,0", "--std", "1,1,1").returncode == 0
    return sh.service_config(model, **{"service.results.path": str(results), "runtime.frames": 20,
                                       "preprocess.resize": 37, "preprocess.crop": 32, **more})


def test_every_timed_frame_is_one_json_line_in_the_file_with_its_top_k(tmp_path):
    results = tmp_path / "results.jsonl"
    report = run(Runtime(red_model_config(tmp_path, results), log=sh.ListLog()), StopFlag())
    lines = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == report["frames"] == 20  # warm-up frames are not delivered
    assert [line["frame"] for line in lines] == sorted(line["frame"] for line in lines)
    for line in lines:
        assert line["status"] in ("ok", "miss") and line["end_to_end_ms"] > 0
        assert len(line["top"]) == 3 and {t["label"] for t in line["top"]} == {"red", "green", "blue"}
        assert line["top"][0]["score"] >= line["top"][1]["score"] >= line["top"][2]["score"]
    assert report["top_classes"][0]["frames"] == sum(1 for line in lines
                                                      if line["top"][0]["label"] == report["top_classes"][0]["label"])


def test_a_fifo_without_a_reader_never_stalls_the_frames_and_a_late_reader_gets_whole_lines(tmp_path):
    fifo = tmp_path / "results.fifo"
    os.mkfifo(str(fifo))
    cfg = red_model_config(tmp_path, fifo, **{"runtime.frames": 0})
    runtime = Runtime(cfg, log=sh.ListLog())
    stop = StopFlag()
    thread = threading.Thread(target=run, args=(runtime, stop), daemon=True)
    thread.start()
    try:
        assert sh.wait_until(lambda: runtime.pipeline is not None and runtime.pipeline.recorder.frames >= 40, 60)
        sink = next(s for s in runtime.sinks if isinstance(s, ResultsSink))
        assert sh.wait_until(lambda: sink.dropped_total >= 20, 30)  # no reader: dropped, and frames went on
        with open(str(fifo), "rb") as reader:  # a reader comes: it gets lines, each one whole
            first = [json.loads(reader.readline()) for _ in range(5)]
        assert all(line["top"][0]["label"] in ("red", "green", "blue") for line in first)
        assert "dropped" in first[0] and first[0]["dropped"] >= 1  # the first line says how many it missed
        frames = runtime.pipeline.recorder.frames
        assert sh.wait_until(lambda: runtime.pipeline.recorder.frames >= frames + 20, 30)  # reader gone: on
    finally:
        stop.request("test")
        thread.join(30)
    assert not thread.is_alive()


def test_a_path_it_must_not_write_is_refused_at_start_in_one_line(tmp_path):
    (tmp_path / "elsewhere").write_text("", encoding="utf-8")
    os.symlink(str(tmp_path / "elsewhere"), str(tmp_path / "link"))
    model = colour_model(tmp_path / "m.onnx")
    for path, why in ((tmp_path / "link", "is a symlink"), (tmp_path, "is a folder"),
                      (tmp_path / "no" / "such" / "r.jsonl", "cannot write the results")):
        config = sh.write_config(tmp_path / "c.yaml", {"service": {"results": {"path": str(path)}},
                                                      "preprocess": {"resize": 37, "crop": 32}})
        assert_refused(edge_here("run", "--config", config, "--model", model, "--frames", 1), str(path), why)
