"""`edge sweep`'s options, declared once (edge.fields): argparse (edge/cli/sweep.py), the bounds check and a caller
building a sweep in code read this one declaration. The regression thresholds, --compare and --fail-on-regression
are `edge check`'s (one default)."""

from dataclasses import dataclass
from typing import Any, List

from edge.bench.check import RegressionOptions
from edge.bench.report import check_outputs
from edge.config import MAX_CAMERAS
from edge.errors import EdgeError
from edge.fields import check_options, setting

MAX_DURATION_S = 86400.0  # --duration's most


def _not_empty(values: Any, label: str) -> None:
    if not values:
        raise EdgeError("{} must list numbers 1-{}, got none".format(label, MAX_CAMERAS))


@dataclass(frozen=True)
class SweepOptions(RegressionOptions):
    batch: List[int] = setting([1, 2, 4], "largest batch per cell", low=1, high=MAX_CAMERAS, check=_not_empty,
                               flag="--batch")
    streams: List[int] = setting([1, 2, 4], "cameras per cell", low=1, high=MAX_CAMERAS, check=_not_empty,
                                 flag="--streams")
    fps: float = setting(30.0, "each camera's frame rate", low=0.01, high=1000.0, flag="--fps")
    duration: float = setting(20.0, "seconds per cell, in --windows windows", low=0.1, high=MAX_DURATION_S,
                              flag="--duration")
    windows: int = setting(3, "windows that must agree", low=1, high=1000, flag="--windows")
    max_windows: int = setting(6, "windows per cell at most", low=1, high=1000, flag="--max-windows")
    agree_pct: float = setting(10.0, "windows agree when throughput and p99 are within this %", low=0.0,
                               high=1000.0, flag="--agree-pct")
    jitter_ms: float = setting(2.0, "each frame within +- this of its slot", low=0.0, high=1000.0,
                               flag="--jitter-ms")
    load: str = setting("open", "open: cameras at --fps, latency from capture; closed: batches back to back, the "
                                "engine's capacity only", choices=("open", "closed"), flag="--load")
    drop_budget_pct: float = setting(0.1, "the knee drops at most this % of frames", low=0.0, high=100.0,
                                     flag="--drop-budget-pct")
    seed: int = setting(0, "phases and jitter", low=0, high=2 ** 31 - 1, flag="--seed")
    json: str = setting("sweep.json", "JSON report ('' for none)", flag="--json")
    csv: str = setting("sweep.csv", "one row per cell ('' for none)", flag="--csv")
    plot: str = setting("sweep.png", "PNG figure ('' for none)", flag="--plot")

    def outputs(self) -> List[Any]:
        """(path, what) of each output asked for, the JSON report first: the one a late failure must not cost."""
        return [(p, what) for p, what in ((self.json, "JSON report"), (self.csv, "CSV"), (self.plot, "figure")) if p]


def check_sweep(options: SweepOptions) -> None:
    """Bad options and unwritable outputs are refused before anything runs (one line naming the flag)."""
    check_options(options)
    if options.windows > options.max_windows:
        raise EdgeError("--windows and --max-windows: windows <= max-windows, got {} and {}".format(
            options.windows, options.max_windows))
    check_outputs(options.outputs(), "--json, --csv and --plot")
