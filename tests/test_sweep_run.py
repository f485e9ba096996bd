"""edge.bench.sweep_run: each window measures the peak memory of its own stretch, the progress bar is drawn on a
terminal only, and an output that fails when written costs no other."""

import csv
import dataclasses
import io
import json

import numpy as np
from test_sweep_report import window

from edge.bench.sweep_options import SweepOptions
from edge.bench.sweep_report import build_report, cell_figures
from edge.bench.sweep_run import PeakMemory, Progress, write_outputs


def test_each_window_measures_the_peak_memory_of_its_own_stretch():
    """Peak RSS per cell: the high-water mark is reset at each window's start, so a cell that needed 100 MB more
    shows it and the next one does not inherit it."""
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


def test_the_progress_bar_is_drawn_on_a_terminal_only():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        bar = Progress(4, stream)
        bar.step("2 cameras x batch 2")
        bar.close()
        assert ("\r[#######" in stream.getvalue()) == drawn and ("1/4 windows" in stream.getvalue()) == drawn


def test_an_output_that_fails_at_write_time_costs_no_other(tmp_path):
    """The JSON is written first; a figure that fails only when written (/proc/x.png; a disk filling during a long
    sweep) is named, and the JSON and CSV are kept, the JSON saying the figure is missing."""
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
