"""`edge sweep` on the CPU: batch sizes x cameras through the service's own loop on a model with a batch axis; JSON,
CSV and a PNG; goodput never above what the cameras offered; the knee and its exit code; --compare; bad input."""

import csv
import dataclasses
import json
import math
import struct

import pytest
import yaml

from edge.bench.sweep_report import COLUMNS, Window, agree, build_report, cell_figures, compare, format_report

from conftest import assert_refused, edge_here, run_edge


def png_size(path):
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.fixture
def small_frames(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({"source": {"width": 320, "height": 240},
                                    "service": {"telemetry": {"enabled": False}}}), encoding="utf-8")
    return str(path)


def test_sweep_writes_json_csv_and_png_with_goodput_within_the_offered_load(tmp_path, dynamic_model):
    out = {k: str(tmp_path / ("sweep." + k)) for k in ("json", "csv", "png")}
    # batches form by construction on any machine, however loaded: no batch's cost nears a 1 s budget, and a
    # 40 ms wait (longer than a 30 fps frame period) lets every live camera's next frame join
    config = tmp_path / "batching.yaml"
    config.write_text(yaml.safe_dump({"source": {"width": 320, "height": 240},
                                      "runtime": {"budget_ms": 1000.0, "batching": {"max_wait_ms": 40.0}},
                                      "service": {"telemetry": {"enabled": False}}}), encoding="utf-8")
    proc = run_edge("sweep", "--config", str(config), "--model", dynamic_model, "--batch", "1,2,4", "--streams",
                    "1,2,4", "--duration", 3, "--max-windows", 3, "--json", out["json"], "--csv", out["csv"],
                    "--plot", out["png"], timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # the knee depends on this machine: either is a verdict
    report = json.loads(open(out["json"], encoding="utf-8").read())
    assert report["verdict"] in (("pass", "unsettled") if proc.returncode == 0 else ("fail",))
    cells = report["cells"]
    assert sorted((c["streams"], c["batch"]) for c in cells) == [(s, b) for s in (1, 2, 4) for b in (1, 2, 4)]
    for c in cells:
        assert c["achieved_fps"] > 0
        assert c["goodput_fps"] <= c["achieved_fps"] <= c["offered_fps"], c
        assert 0 <= c["drop_pct"] <= 100 and 0 <= c["miss_pct"] <= 100
        assert c["mean_batch"] <= min(c["streams"], c["batch"])
        assert all(int(size) <= c["batch"] for size in c["batch_hist"])
        assert 1 <= c["windows"] <= 3
        assert c["peak_rss_mb"] > 10 and c["context_memory_mb"] is None  # ONNX Runtime: no TensorRT contexts
    assert any(c["mean_batch"] > 1 for c in cells if c["batch"] > 1 and c["streams"] > 1)  # batches formed
    assert sum(c["knee"] for c in cells) == (1 if proc.returncode == 0 else 0)
    rows = list(csv.DictReader(open(out["csv"], encoding="utf-8")))
    assert list(rows[0]) == list(COLUMNS) and len(rows) == 9
    assert png_size(out["png"]) == (1200, 900)
    assert "knee" in proc.stdout.lower() or "no cell meets" in proc.stdout
    assert "\r[" not in proc.stderr  # no progress bar when stderr is no terminal


def window(fps, p99_ms, frames=100, dropped=0):
    w = Window(1.0)
    w.stage_ms["end_to_end"] = [p99_ms] * frames
    for name in ("frame_age", "preprocess", "infer", "postprocess"):
        w.stage_ms[name] = [p99_ms / 4] * frames
    w.batch, w.camera, w.ok = [2] * frames, ["a", "b"] * (frames // 2), [p99_ms <= 30] * frames
    w.seconds, w.offered, w.produced, w.dropped = frames / fps, frames, frames, dropped
    return w


def test_windows_agree_within_the_tolerance_only():
    assert agree([window(100, 10), window(105, 10.5), window(100, 10)], 3, 10.0)
    assert not agree([window(100, 10), window(100, 12)], 3, 10.0)  # too few
    assert not agree([window(100, 10), window(100, 12), window(100, 10)], 3, 10.0)  # p99 20 % apart
    assert not agree([window(60, 10), window(100, 10), window(100, 10)], 3, 10.0)  # throughput apart


def test_the_knee_is_the_most_goodput_within_the_budgets():
    def cell(streams, batch, fps, p99, stable=True, dropped=0):
        return cell_figures([window(fps, p99, dropped=dropped)] * 3, streams=streams, batch=batch, fps=30.0,
                            budget_ms=30.0, stable=stable, all_windows=3)

    cells = [cell(1, 1, 30, 8), cell(2, 2, 60, 12), cell(4, 2, 120, 29), cell(4, 4, 120, 25),  # a tie: batch 2 wins
             cell(8, 4, 240, 45),  # over the budget
             cell(8, 2, 230, 20, stable=False),  # not stable
             cell(6, 4, 180, 20, dropped=5)]  # drops 5 % > 0.1 %
    report = build_report(cells, {"budget_ms": 30.0, "drop_budget_pct": 0.1}, {}, {})
    assert report["verdict"] == "pass" and report["knee"] == {"streams": 4, "batch": 2, "settled": True}
    assert report["max_cameras_within_budget"] == 4
    assert len(report["left_out"]) == 3
    none = build_report([cell(8, 4, 240, 45)], {"budget_ms": 30.0, "drop_budget_pct": 0.1}, {}, {})
    assert none["verdict"] == "fail" and none["knee"] is None


def test_windows_that_never_agree_give_an_unsettled_knee_with_the_duration_that_would_settle_it():
    """A shared machine: every cell within the budgets, none stable. Not FAIL: the knee among them, the spread its
    windows showed and a --duration that would likely settle it (spread shrinking as 1/sqrt(window length))."""
    def noisy(streams, batch, fps):
        windows = [window(fps, 10), window(fps * 1.3, 10), window(fps, 10)]  # throughput 30 % apart
        return cell_figures(windows, streams=streams, batch=batch, fps=30.0, budget_ms=30.0, stable=False,
                            all_windows=6)

    settings = {"budget_ms": 30.0, "drop_budget_pct": 0.1, "agree_pct": 10.0, "windows": 3}
    cells = [noisy(1, 1, 30), noisy(4, 1, 119), noisy(4, 2, 100)]
    report = build_report(cells, settings, {}, {})
    assert report["verdict"] == "unsettled" and report["knee"] == {"streams": 4, "batch": 1, "settled": False}
    knee_cell = cells[1]
    assert knee_cell["window_spread_pct"] == 30.0
    expected = math.ceil(knee_cell["window_s"] * (30.0 / 10.0) ** 2 * 3)
    assert knee_cell["settle_duration_s"] == expected
    assert "30.0% apart" in report["verdict_reason"] and "--duration {:g}".format(expected) in \
        report["verdict_reason"]
    assert report["left_out"] == [] and report["max_cameras_within_budget"] == 4
    hopeless = build_report([noisy(4, 1, 119)], dict(settings, agree_pct=0.01), {}, {})
    assert "no --duration up to 86400 s would likely settle it" in hopeless["verdict_reason"]
    assert format_report(dict(report, settings=dict(settings, load="open", fps=30.0))).count("UNSETTLED") == 1
    assert "batches back to back" in format_report(dict(report, settings=dict(settings, load="closed", fps=None)))
    # a stable cell within the budgets is still preferred to a busier unstable one
    steady = cell_figures([window(60, 12)] * 3, streams=2, batch=2, fps=30.0, budget_ms=30.0, stable=True,
                          all_windows=3)
    settled = build_report([noisy(4, 1, 119), steady], settings, {}, {})
    assert settled["verdict"] == "pass" and settled["knee"] == {"streams": 2, "batch": 2, "settled": True}
    assert settled["left_out"] == ["4x1: not stable"]


def test_each_window_measures_the_peak_memory_of_its_own_stretch():
    """Peak RSS per cell: the high-water mark is reset at each window's start, so a cell that needed 100 MB more
    shows it and the next one does not inherit it."""
    import numpy as np

    from edge.bench.sweep_run import PeakMemory

    memory = PeakMemory()
    memory.reset()
    block = np.ones(100 * 2 ** 20 // 8)  # 100 MB, written
    busy = memory.peak_mb()
    del block
    memory.reset()
    quiet = memory.peak_mb()
    assert busy - quiet > 80
    cell = cell_figures([dataclasses.replace(window(30, 10), peak_rss_mb=m, ram_fraction=r) for m, r in
                         ((120.0, 0.4), (150.0, 0.5), (130.0, None))], streams=1, batch=1, fps=30.0,
                        budget_ms=30.0, stable=True, all_windows=3, context_memory_mb=12.5)
    assert (cell["peak_rss_mb"], cell["ram_used_pct"], cell["context_memory_mb"]) == (150.0, 50.0, 12.5)


def test_a_batch_cut_by_a_window_edge_counts_as_one_batch():
    """Frames of size-2 batches, 201 recorded (the window's edge cut one batch): 101 batches, mean under 2."""
    cell = cell_figures([window(60, 10, frames=201)], streams=2, batch=2, fps=30.0, budget_ms=30.0, stable=True,
                        all_windows=1)
    assert cell["batch_hist"] == {2: 101} and cell["mean_batch"] == round(201 / 101, 3) <= 2


def test_compare_flags_a_cell_that_got_worse():
    now = [cell_figures([window(40, 20)] * 3, streams=2, batch=2, fps=30.0, budget_ms=30.0, stable=True,
                        all_windows=3)]
    before = {"cells": [dict(now[0], goodput_fps=60.0, p99_ms=12.0)]}
    result = compare(now, before, "old.json", pct=10.0, ms=0.5)
    assert len(result["regressions"]) == 2 and "goodput_fps" in result["regressions"][0]
    assert not compare(now, {"cells": now}, "same.json", pct=10.0, ms=0.5)["regressions"]


@pytest.mark.parametrize("args, names", [
    (["--batch", "0,2"], ["--batch"]),
    (["--streams", "1,99"], ["--streams"]),
    (["--fps", "nan"], ["--fps"]),
    (["--windows", "4", "--max-windows", "3"], ["--windows"]),
    (["--json", "same.out", "--csv", "same.out"], ["different files"]),
    (["--plot", "sw.png", "--csv", "./sw.png"], ["different files", "./sw.png"]),  # one file, two spellings
    (["--batch", ","], ["--batch", "got none"]),
    (["--seed", "-1"], ["--seed"]),
])
def test_bad_input_is_refused_before_anything_runs(tmp_path, monkeypatch, args, names):
    monkeypatch.chdir(tmp_path)
    assert_refused(edge_here("sweep", *args), *names)


def test_a_batch_one_model_is_refused_for_larger_batches(tmp_path, tiny_classifiers, small_frames):
    proc = edge_here("sweep", "--config", small_frames, "--model", tiny_classifiers[0], "--batch", "1,2",
                     "--json", tmp_path / "s.json", "--csv", "", "--plot", "")
    assert_refused(proc, "--batch 2", "edge export --batch dynamic")
    assert not (tmp_path / "s.json").exists()


def test_the_progress_bar_is_drawn_on_a_terminal_only():
    import io

    from edge.bench.sweep_run import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        bar = Progress(4, stream)
        bar.step("2 cameras x batch 2")
        bar.close()
        assert ("\r[#######" in stream.getvalue()) == drawn and ("1/4 windows" in stream.getvalue()) == drawn


@pytest.mark.parametrize("cell, names", [
    ({"streams": 1, "batch": 1, "p99_ms": [1, 2]}, ["cells[0].p99_ms", "[1, 2]"]),
    ({"streams": 1, "batch": 1, "goodput_fps": {"a": 1}}, ["cells[0].goodput_fps"]),
    ({"streams": [1], "batch": 1}, ["cells[0].streams"]),
    ({"streams": 1, "batch": True}, ["cells[0].batch"]),
    ([1, 2], ["cells[0]", "mapping"]),
])
def test_a_previous_sweep_is_checked_cell_by_cell_before_any_cell_runs(tmp_path, monkeypatch, cell, names):
    """The cells of --compare are read at the end: a list or object where a number belongs was a traceback after
    the whole sweep, and no JSON or CSV. The model is missing here: the check comes first."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": 1, "cells": [cell]}), encoding="utf-8")
    proc = edge_here("sweep", "--model", tmp_path / "none.onnx", "--compare", "old.json", "--plot", "")
    assert_refused(proc, "old.json", *names)
    assert not (tmp_path / "sweep.json").exists()


def test_an_output_that_fails_at_write_time_costs_no_other(tmp_path):
    """The JSON is written first; a figure that fails only when written (/proc/x.png; a disk filling during a long
    sweep) is named, and the JSON and CSV are kept, the JSON saying the figure is missing."""
    from edge.bench.sweep_options import SweepOptions
    from edge.bench.sweep_run import write_outputs

    cells = [cell_figures([window(60, 10)] * 3, streams=2, batch=2, fps=30.0, budget_ms=30.0, stable=True,
                          all_windows=3)]
    settings = {"budget_ms": 30.0, "drop_budget_pct": 0.1, "load": "open", "fps": 30.0}
    report = build_report(cells, settings, {}, {})
    options = SweepOptions(json=str(tmp_path / "s.json"), csv=str(tmp_path / "s.csv"), plot="/proc/x.png")
    write_outputs(report, options)
    assert len(report["output_errors"]) == 1 and report["output_errors"][0].startswith("figure /proc/x.png")
    saved = json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))
    assert saved["output_errors"] == report["output_errors"] and saved["figure"] is None
    assert len(list(csv.DictReader(open(str(tmp_path / "s.csv"), encoding="utf-8")))) == 1


def test_check_and_sweep_share_one_regression_declaration():
    from edge.bench.check import CheckOptions
    from edge.bench.sweep_options import SweepOptions
    from edge.fields import leaves

    shared = ("regression_pct", "regression_ms")
    sweep, check = ({d: f for d, f, _ in leaves(cls) if d in shared} for cls in (SweepOptions, CheckOptions))
    assert all(sweep[d] is check[d] for d in shared)  # one declaration, one default
    assert SweepOptions().regression_ms == CheckOptions().regression_ms == 0.2


def test_the_sweep_options_the_command_line_gives_are_the_declared_ones():
    import argparse

    from edge.bench.sweep_options import SweepOptions
    from edge.cli import sweep
    from edge.fields import as_argv, options_from

    parser = argparse.ArgumentParser()
    sweep.add_arguments(parser)
    assert options_from(parser.parse_args([]), SweepOptions) == SweepOptions()
    wanted = SweepOptions(batch=[1, 8], streams=[3], load="closed", fail_on_regression=True, compare="old.json",
                          plot="", seed=7, regression_ms=0.0)
    assert options_from(parser.parse_args(as_argv(wanted)), SweepOptions) == wanted
