"""`edge sweep`: batch sizes x camera counts through the service's own loop, and the knee of the trade-off.

    edge sweep --config C --batch 1,2,4,8 --streams 1,2,4 --fps 30 --duration 20

Open loop (the default): each cell is `edge run` with N synthetic cameras at --fps, each with its own phase and
jitter, served by the deadline batcher up to the cell's batch size, on the one model loaded once; latency is
measured from each frame's capture, so a late batch shows in every frame it delayed (no coordinated omission).
`--load closed` runs batches back to back instead: the engine's raw capacity only, no cameras.

Each cell runs in windows of --duration / --windows seconds, the cells interleaved round by round (a noisy machine
hits them alike), until its last --windows windows agree within --agree-pct on throughput and p99, at most
--max-windows. The verdict is the knee (edge/bench/sweep_report.py): exit 0 when a cell meets the budget and the
drop budget (UNSETTLED when none of those cells' windows agreed: the spread, and the --duration that would settle
it), 1 when none does, 2 when it could not run. Each cell has its peak process RSS (and, with TensorRT, the engine
contexts' device memory). Writes the JSON, then the CSV and a PNG; `--compare old.json` flags cells whose goodput
fell or whose p99 rose.
"""

import argparse
from typing import Any

from edge.bench.sweep_options import SweepOptions
from edge.cli.common import add_command, add_config_flags, config_from_args
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError
from edge.fields import add_flags, leaves, options_from


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, "model.path", "runtime.budget_ms", "backend.kind", "preprocess.device")  # cameras: synthetic
    add_flags(p, SweepOptions, *(dotted for dotted, _, _ in leaves(SweepOptions)))


def cmd_sweep(args: argparse.Namespace) -> int:
    options = options_from(args, SweepOptions)
    from edge.bench.sweep_run import run_sweep  # the frame path: loaded when run

    report = run_sweep(config_from_args(args), options, out=lambda s: print(s, flush=True))
    if report["output_errors"]:  # the table is printed and every other output written
        raise EdgeError("; ".join(report["output_errors"]))
    if report["verdict"] == "fail":
        return EXIT_FAIL
    if options.fail_on_regression and report["comparison"] and report["comparison"]["regressions"]:
        return EXIT_FAIL
    return EXIT_OK


def register(subparsers: Any) -> None:
    add_command(subparsers, "sweep", "batch sizes x cameras: throughput against p99, and the knee", __doc__,
                add_arguments, cmd_sweep)
