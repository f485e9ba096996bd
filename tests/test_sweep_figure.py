"""edge.bench.sweep_figure: the sweep's figure (goodput curves, the p99 heat map, the focus cell's stages and batches)
is a PNG of the documented size, drawn also when no cell meets the budget."""

import cv2
import pytest
from test_sweep_report import window

from edge.bench.report import FIGURE_PX
from edge.bench.sweep_figure import plot
from edge.bench.sweep_report import build_report, cell_figures

SETTINGS = {"budget_ms": 30.0, "drop_budget_pct": 0.1, "load": "open", "fps": 30.0}


def cell(streams, batch, fps, p99):
    return cell_figures([window(fps, p99)] * 3, streams=streams, batch=batch, fps=30.0, budget_ms=30.0, stable=True,
                        all_windows=3)


@pytest.mark.parametrize("cells", [[cell(1, 1, 30, 8), cell(2, 2, 60, 12), cell(4, 2, 110, 45)],
                                   [cell(4, 4, 120, 45)]], ids=["a knee", "none within the budget"])
def test_the_figure_is_a_png_of_the_documented_size(tmp_path, cells):
    report = dict(build_report(cells, SETTINGS, {"backend": "onnxruntime", "model": "m.onnx"}, {"hostname": "h"}),
                  settings=SETTINGS)
    path = str(tmp_path / "sweep.png")
    plot(path, report)
    image = cv2.imread(path)
    assert image is not None and (image.shape[1], image.shape[0]) == FIGURE_PX
    assert image.std() > 10  # not a blank canvas
