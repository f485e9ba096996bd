"""What every measurement report shares (`edge check`'s, `edge sweep`'s): the schema version, reading a previous
report back, the numbers it may hold, the one regression rule, and the figure's canvas. Each report says what its
rows are (check_report: stages; sweep_report: cells)."""

import math
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from edge.errors import EdgeError, require
from edge.fields import show
from edge.inputs import load_json
from edge.store.fileio import atomic_write, check_output

SCHEMA_VERSION = 1  # of every report edge writes; a report of another version is refused, never misread
FIGURE_SIZE_IN, FIGURE_DPI = (12.0, 9.0), 100
FIGURE_PX = (int(FIGURE_SIZE_IN[0] * FIGURE_DPI), int(FIGURE_SIZE_IN[1] * FIGURE_DPI))  # (width, height)
STAGE_COLOURS = ("#c8c8c8", "#dd8452", "#4c72b0", "#55a868")  # edge.infer.latency.STACKED's, in both figures


def load_previous(path: str, *, tool: str, rows: str, check_row: Optional[Callable[[str, str, Any], None]] = None
                  ) -> Dict[str, Any]:
    """A previous report of `tool` ("edge check"), whose `rows` key ("stages_ms") holds what a comparison reads; each
    row passed to `check_row(path, "rows[key]", row)` before any work is done: one line naming the file and key,
    never a traceback after a long run."""
    data = load_json(path, "previous report")
    if not isinstance(data, dict) or not isinstance(data.get(rows), (dict, list)):
        raise EdgeError("{}: not an {} report (no '{}')".format(path, tool, rows))
    if data.get("schema_version") != SCHEMA_VERSION:
        raise EdgeError("{}: schema_version {}, this {} reads {}".format(
            path, show(data.get("schema_version")), tool, SCHEMA_VERSION))
    if check_row is not None:
        items = data[rows].items() if isinstance(data[rows], dict) else enumerate(data[rows])
        for key, row in items:
            check_row(path, "{}[{}]".format(rows, key), row)
    return data


def check_outputs(outputs: List[Tuple[str, str]], flags: str) -> None:
    """Before the run: each output (path, what) a file this user can write, no two of them one file (./a.png is
    a.png), and matplotlib there when a figure is asked for."""
    for path, what in outputs:
        check_output(path, what)
    if len({os.path.realpath(p) for p, _ in outputs}) < len(outputs):
        raise EdgeError("{} must name different files, got {}".format(flags, ", ".join(p for p, _ in outputs)))
    if any(what == "figure" for _, what in outputs):
        require("matplotlib")


def finite(value: Any) -> Optional[float]:
    """A report's number, or None for anything else (strings, booleans, NaN, a 400-digit number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and abs(number) < 1e12 else None


def judge(was: Any, now: Any, *, pct: float, ms: float, higher_is_worse: bool = True
          ) -> Optional[Tuple[Dict[str, Any], bool]]:
    """(the comparison's entry, regressed) of one figure, or None when either value is not a number. A time
    (higher_is_worse) regresses when worse by more than `pct` percent AND more than `ms` ms; a rate when lower by
    more than `pct` percent."""
    old, new = finite(was), finite(now)
    if old is None or new is None:
        return None
    delta = new - old
    rel = 100.0 * delta / old if old > 0 else None
    if higher_is_worse:
        worse = delta > ms and (rel is None or rel > pct)
    else:
        worse = rel is not None and rel < -pct
    entry = {"previous": old, "current": new, "delta_pct": None if rel is None else round(rel, 1), "regressed": worse}
    return (dict(entry, delta_ms=round(delta, 3)) if higher_is_worse else entry), worse


def new_figure() -> Any:
    """A FIGURE_PX matplotlib Figure on the Agg canvas (no display needed)."""
    require("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI)
    FigureCanvasAgg(fig)
    return fig


def save_figure(path: str, fig: Any) -> Dict[str, Any]:
    """Write `fig` to `path` as a PNG, atomically; what a report says of it."""
    atomic_write(path, lambda fh: fig.savefig(fh, dpi=FIGURE_DPI, format="png"), "figure")
    return figure_facts(path)


def figure_facts(path: str) -> Dict[str, Any]:
    return {"path": path, "width_px": FIGURE_PX[0], "height_px": FIGURE_PX[1]}
