"""edge.bench.sweep_report, on constructed windows: when windows agree, the knee (the most goodput within the
budgets; unsettled, with the duration that would settle it, when no cell is stable), a batch cut by a window's edge,
and a comparison that flags a cell that got worse."""

import math

from edge.bench.sweep_report import Window, agree, build_report, cell_figures, compare, format_report


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
