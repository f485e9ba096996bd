"""edge.bench.check_figure: `edge check`'s figure (the latency histogram with the budget line, the per-frame stacked
stages, the telemetry traces, each said unavailable where it was) is a PNG of the documented size, the budget drawn
in red where it is on the scale."""

import cv2
import numpy as np
import pytest

from edge.bench.check_figure import plot
from edge.bench.check_report import SeriesSink
from edge.bench.report import FIGURE_PX
from edge.infer.pipeline import Result

from conftest import colour_pixels

BUDGET_RED = (46, 34, 207)  # BGR of the budget line (#cf222e)


def series_of(frames):
    series = SeriesSink(capacity=frames)
    for i in range(frames):
        e2e = 8.0 + (i % 10)  # 8-17 ms
        stages = {"capture": 1.0, "frame_age": 0.5, "preprocess": 2.0, "infer": e2e - 4.0, "postprocess": 0.5,
                  "end_to_end": e2e}
        series.on_result(Result(i + 1, i + 1, stages, None, "miss" if e2e > 15 else "ok", None, np.zeros(1)))
    return series


def report_of(budget_ms, series):
    e2e = series.series("end_to_end")
    return {"budget_ms": budget_ms, "verdict": "pass", "backend": "onnxruntime", "precision": "fp32",
            "frames": series.count, "misses": int(series.missed.sum()), "miss_rate": float(series.missed.mean()),
            "stages_ms": {"end_to_end": {"p50": float(np.percentile(e2e, 50)), "p99": float(np.percentile(e2e, 99))}},
            "system": {"hostname": "test"}, "model": {}, "warnings": [],
            "telemetry": {"status": "unavailable", "reason": "no jtop on this machine"}}


@pytest.mark.parametrize("budget_ms, red", [(15.0, True), (1000.0, False)], ids=["on the scale", "off the scale"])
def test_the_figure_is_a_png_of_the_documented_size_with_the_budget_line(tmp_path, budget_ms, red):
    series = series_of(200)
    telemetry = [(float(t), {"temperature_c": 40.0 + t}) for t in range(5)]  # power and clocks: unavailable
    path = str(tmp_path / "check.png")
    facts = plot(path, report_of(budget_ms, series), series, telemetry, 0.0)
    image = cv2.imread(path)
    assert facts["path"] == path and (image.shape[1], image.shape[0]) == FIGURE_PX and image.std() > 10
    assert (colour_pixels(image, BUDGET_RED, tol=20) > 1000) is red, colour_pixels(image, BUDGET_RED, tol=20)
