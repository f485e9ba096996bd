"""`edge sweep`: batch sizes x camera counts through the service's own loop, and the knee of the trade-off.

    edge sweep --config C --batch 1,2,4,8 --streams 1,2,4 --fps 30 --duration 20

Open loop (the default): each cell is `edge run` with N synthetic cameras at --fps, each with its own phase and
jitter, served by the deadline batcher up to the cell's batch size, on the one model loaded once; latency is
measured from each frame's capture, so a late batch shows in every frame it delayed (no coordinated omission).
`--load closed` runs batches back to back instead: the engine's raw capacity only, no cameras.

Each cell runs in windows of --duration / --windows seconds, the cells interleaved round by round (a noisy machine
hits them alike), until its last --windows windows agree within --agree-pct on throughput and p99, at most
--max-windows. The verdict is the knee (edge/bench/sweep_report.py): exit 0 when a stable cell meets the budget
and the drop budget, 1 when none does, 2 when it could not run. Writes JSON, CSV and a PNG; `--compare old.json`
flags cells whose goodput fell or whose p99 rose.
"""

import argparse
from typing import Any, List, Optional, Sequence

from edge.cli.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.config import MAX_CAMERAS
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError, require
from edge.store.fileio import check_output


def check_options(options: argparse.Namespace) -> None:
    """Bad flags and unwritable outputs are refused before anything runs."""
    for flag, values in (("--batch", options.batch), ("--streams", options.streams)):
        if not values or any(not 1 <= v <= MAX_CAMERAS for v in values):
            raise EdgeError("{} must list numbers 1-{}, got {}".format(flag, MAX_CAMERAS, values))
    for flag, value, low, high in (("--fps", options.fps, 0.01, 1000.0), ("--duration", options.duration, 0.1, 86400),
                                   ("--agree-pct", options.agree_pct, 0.0, 1000.0),
                                   ("--jitter-ms", options.jitter_ms, 0.0, 1000.0),
                                   ("--drop-budget-pct", options.drop_budget_pct, 0.0, 100.0),
                                   ("--regression-pct", options.regression_pct, 0.0, 1e9),
                                   ("--regression-ms", options.regression_ms, 0.0, 1e9)):
        if not low <= value <= high:  # also refuses NaN
            raise EdgeError("{} must be {:g}-{:g}, got {}".format(flag, low, high, value))
    if not 1 <= options.windows <= options.max_windows <= 1000:
        raise EdgeError("--windows and --max-windows: 1 <= windows <= max-windows <= 1000, got {} and {}".format(
            options.windows, options.max_windows))
    paths = [(p, what) for p, what in ((options.json, "JSON report"), (options.csv, "CSV"), (options.plot, "figure"))
             if p]
    for path, what in paths:
        check_output(path, what)
    if len({p for p, _ in paths}) < len(paths):
        raise EdgeError("--json, --csv and --plot must name different files")
    if options.plot:
        require("matplotlib")


# --- command line ------------------------------------------------------------------------------------------

def _sizes(text: str) -> List[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of whole numbers, e.g. 1,2,4") from None
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, "model.path", "runtime.budget_ms", "backend.kind", "preprocess.device")  # cameras: synthetic
    p.add_argument("--batch", type=_sizes, default=[1, 2, 4], help="largest batch per cell (default 1,2,4)")
    p.add_argument("--streams", type=_sizes, default=[1, 2, 4], help="cameras per cell (default 1,2,4)")
    p.add_argument("--fps", type=float, default=30.0, help="each camera's frame rate (default %(default)s)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per cell, in --windows windows "
                                                                 "(default %(default)s)")
    p.add_argument("--windows", type=int, default=3, help="windows that must agree (default %(default)s)")
    p.add_argument("--max-windows", type=int, default=6, help="windows per cell at most (default %(default)s)")
    p.add_argument("--agree-pct", type=float, default=10.0,
                   help="windows agree when throughput and p99 are within this %% (default %(default)s)")
    p.add_argument("--jitter-ms", type=float, default=2.0, help="each frame within +- this of its slot "
                                                                 "(default %(default)s)")
    p.add_argument("--load", choices=("open", "closed"), default="open",
                   help="open: cameras at --fps, latency from capture (default); closed: batches back to back, "
                        "the engine's capacity only")
    p.add_argument("--drop-budget-pct", type=float, default=0.1,
                   help="the knee drops at most this %% of frames (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="phases and jitter (default %(default)s)")
    p.add_argument("--json", default="sweep.json", metavar="PATH", help="JSON report ('' for none)")
    p.add_argument("--csv", default="sweep.csv", metavar="PATH", help="one row per cell ('' for none)")
    p.add_argument("--plot", default="sweep.png", metavar="PATH", help="PNG figure ('' for none)")
    p.add_argument("--compare", metavar="PATH", help="a previous sweep: flag cells that got worse")
    p.add_argument("--regression-pct", type=float, default=10.0, help="flag when worse by more than this %%")
    p.add_argument("--regression-ms", type=float, default=0.5, help="... and a p99 by more than this many ms")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when a regression is flagged")


def cmd_sweep(args: argparse.Namespace) -> int:
    check_options(args)
    from edge.bench.sweep_run import run_sweep  # the frame path: loaded when run

    report = run_sweep(config_from_args(args), args, out=lambda s: print(s, flush=True))
    if report["verdict"] != "pass":
        return EXIT_FAIL
    if args.fail_on_regression and report["comparison"] and report["comparison"]["regressions"]:
        return EXIT_FAIL
    return EXIT_OK


def register(subparsers: Any) -> None:
    add_command(subparsers, "sweep", "batch sizes x cameras: throughput against p99, and the knee", __doc__,
                add_arguments, cmd_sweep)


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge sweep") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_sweep, argv)
