"""The `edge sweep` figure, readable without the docs: (a) throughput against p99, a line per batch size, the budget
and the knee marked; (b) cameras x batch, coloured by p99 / budget, each cell's goodput written in it; (c) where a
frame's time goes at the knee (or the best cell); (d) the batch sizes served there."""

from typing import Any, Dict, List, Optional

import numpy as np

from edge.bench.report import STAGE_COLOURS, new_figure, save_figure
from edge.infer.latency import STACKED


def plot(path: str, report: Dict[str, Any]) -> None:
    fig = new_figure()
    grid = fig.add_gridspec(2, 2, left=0.07, right=0.97, top=0.88, bottom=0.07, hspace=0.35, wspace=0.25)
    cells, s = report["cells"], report["settings"]
    passed = report["verdict"] == "pass"
    fig.suptitle("edge sweep: {} - {}".format(report["verdict"].upper(), report["verdict_reason"]), fontsize=12,
                 color="#1a7f37" if passed else "#9a6700" if report["verdict"] == "unsettled" else "#cf222e", y=0.975)
    facts = report["facts"]
    fig.text(0.5, 0.925, "{} {} {} - {} load, {} - budget {:g} ms (p99 end to end), drops <= {:g}% - {}".format(
        facts.get("backend", "?"), facts.get("precision", "?"), facts.get("model", "?").rsplit("/", 1)[-1],
        s["load"], "{:g} fps per camera".format(s["fps"]) if s["fps"] else "batches back to back",
        s["budget_ms"], s["drop_budget_pct"], report["system"].get("hostname", "")) +
        ("\n" + facts["warning"] if facts.get("warning") else ""), ha="center", fontsize=9, color="#57606a")
    best = _focus(cells)
    _curves(fig.add_subplot(grid[0, 0]), cells, s["budget_ms"])
    _heatmap(fig, fig.add_subplot(grid[0, 1]), cells, s["budget_ms"])
    _stages(fig.add_subplot(grid[1, 0]), best, s["budget_ms"])
    _batches(fig.add_subplot(grid[1, 1]), best)
    save_figure(path, fig)


def _focus(cells: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The knee, else the cell with the most goodput."""
    knee = [c for c in cells if c["knee"]]
    served = [c for c in cells if c["p99_ms"] is not None]
    return knee[0] if knee else max(served, key=lambda c: c["goodput_fps"]) if served else None


def _curves(ax: Any, cells: List[Dict[str, Any]], budget: float) -> None:
    for batch in sorted({c["batch"] for c in cells}):
        line = sorted((c for c in cells if c["batch"] == batch and c["p99_ms"] is not None),
                      key=lambda c: c["streams"])
        if not line:
            continue
        xs, ys = [c["achieved_fps"] for c in line], [c["p99_ms"] for c in line]
        ax.plot(xs, ys, marker="o", label="batch <= {}".format(batch))
        for c, x, y in zip(line, xs, ys):
            ax.annotate("{} cam".format(c["streams"]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(budget, color="#cf222e", linestyle="--", linewidth=1.2, label="budget {:g} ms".format(budget))
    for c in cells:
        if c["knee"]:
            ax.plot([c["achieved_fps"]], [c["p99_ms"]], marker="*", markersize=18, color="#d4a72c",
                    markeredgecolor="black", linestyle="none", label="knee")
    ax.set_xlabel("results per second (achieved)")
    ax.set_ylabel("p99 end to end (capture -> result), ms")
    ax.set_title("(a) throughput against p99: lower right is better", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)


def _heatmap(fig: Any, ax: Any, cells: List[Dict[str, Any]], budget: float) -> None:
    streams = sorted({c["streams"] for c in cells})
    batches = sorted({c["batch"] for c in cells})
    ratio = np.full((len(streams), len(batches)), np.nan)
    for c in cells:
        if c["p99_ms"] is not None:
            ratio[streams.index(c["streams"]), batches.index(c["batch"])] = c["p99_ms"] / budget
    image = ax.imshow(ratio, cmap="RdYlGn_r", vmin=0.0, vmax=2.0, origin="lower", aspect="auto")
    for c in cells:
        i, j = streams.index(c["streams"]), batches.index(c["batch"])
        text = "{:.0f}/s{}{}".format(c["goodput_fps"], "" if c["stable"] else "\nunstable",
                                     "\nKNEE" if c["knee"] else "")
        ax.text(j, i, text, ha="center", va="center", fontsize=8, fontweight="bold" if c["knee"] else "normal")
    ax.set_xticks(range(len(batches)))
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_yticks(range(len(streams)))
    ax.set_yticklabels([str(s) for s in streams])
    ax.set_xlabel("largest batch")
    ax.set_ylabel("cameras")
    ax.set_title("(b) p99 / budget (green: within), goodput in each cell", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).set_label("p99 / budget")


def _stages(ax: Any, cell: Optional[Dict[str, Any]], budget: float) -> None:
    if cell is None:
        ax.text(0.5, 0.5, "no cell served a frame", ha="center", va="center", transform=ax.transAxes)
        return
    left = 0.0
    for stage, colour in zip(STACKED, STAGE_COLOURS):
        width = cell["stage_mean_ms"].get(stage) or 0.0
        ax.barh([0], [width], left=left, color=colour, label="{} {:.2f} ms".format(
            "wait (capture -> batch)" if stage == "frame_age" else stage, width))
        left += width
    ax.axvline(budget, color="#cf222e", linestyle="--", linewidth=1.2)
    ax.text(budget, -0.3, " budget {:g} ms".format(budget), color="#cf222e", fontsize=8)
    if cell["p99_ms"] is not None:
        ax.axvline(cell["p99_ms"], color="black", linestyle=":", linewidth=1)
        ax.text(cell["p99_ms"], -0.45, " p99 {:.1f} ms".format(cell["p99_ms"]), fontsize=8)
    ax.set_ylim(-0.6, 1.2)
    ax.set_yticks([])
    ax.set_xlim(0, max(budget, cell["p99_ms"] or 0.0, left) * 1.15)
    ax.set_xlabel("ms (mean per frame)")
    ax.set_title("(c) where a frame's time goes: {} cameras x batch {}{}".format(
        cell["streams"], cell["batch"], " (the knee)" if cell["knee"] else " (no knee: the best cell)"), fontsize=10)
    ax.legend(fontsize=8, loc="upper right", ncol=2)


def _batches(ax: Any, cell: Optional[Dict[str, Any]]) -> None:
    if cell is None or not cell["batch_hist"]:
        ax.text(0.5, 0.5, "no batch served", ha="center", va="center", transform=ax.transAxes)
        return
    sizes = sorted(int(k) for k in cell["batch_hist"])
    counts = [cell["batch_hist"][k] if k in cell["batch_hist"] else cell["batch_hist"][str(k)] for k in sizes]
    ax.bar([str(k) for k in sizes], counts, color="#8172b3")
    ax.set_xlabel("frames in the batch")
    ax.set_ylabel("batches")
    ax.set_title("(d) batch sizes served there (mean {})".format(cell["mean_batch"]), fontsize=10)
