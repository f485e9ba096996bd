"""edge.service.overlay: what the demo draws on a frame (the budget box from the pipeline's own verdict, the untrained
banner) and the mosaic of several cameras."""

import numpy as np

from edge.infer.pipeline import Result
from edge.infer.postprocess import Prediction
from edge.service.overlay import AMBER, GREEN, RED, draw_overlay, mosaic, stats_of

from conftest import colour_pixels

SIZE = (320, 240)


def make_result(e2e_ms, image=None, status="ok"):
    image = np.full((SIZE[1], SIZE[0], 3), 40, np.uint8) if image is None else image
    prediction = Prediction([3, 1, 4, 1, 5], [0.5, 0.2, 0.1, 0.05, 0.01], ["cat", "dog", "owl", "eel", "ant"])
    stages = {"capture": 1.0, "frame_age": 0.2, "preprocess": 1.5, "infer": 4.0, "postprocess": 0.1,
              "end_to_end": e2e_ms}
    return Result(7, 7, stages, prediction, status, None, image)


def test_overlay_budget_box_is_green_within_budget_and_red_over_it():
    frame = np.full((SIZE[1], SIZE[0], 3), 40, np.uint8)
    ok = draw_overlay(frame, make_result(12.0, frame), 30.0, 29.5, trained=True)
    over = draw_overlay(frame, make_result(45.0, frame, "miss"), 30.0, 29.5, trained=True)
    top_right_ok, top_right_over = ok[:12, -30:], over[:12, -30:]
    assert colour_pixels(top_right_ok, GREEN) > 200 and colour_pixels(top_right_ok, RED) == 0
    assert colour_pixels(top_right_over, RED) > 200 and colour_pixels(top_right_over, GREEN) == 0
    assert np.array_equal(frame, np.full_like(frame, 40))  # the pipeline's frame is not drawn on
    assert ok[:60, :100].mean() > frame[:60, :100].mean()  # white text in the top-left panel
    assert colour_pixels(ok, AMBER) == 0  # trained: no banner


def test_overlay_and_stats_read_the_pipelines_verdict_never_a_second_one():
    """The budget box and /stats.json say what the Result's status says (the latency recorder's miss), even where
    the overlay's budget argument would judge the frame otherwise."""
    frame = np.full((SIZE[1], SIZE[0], 3), 40, np.uint8)
    for status, e2e, colour in (("miss", 12.0, RED), ("ok", 45.0, GREEN), ("error", 12.0, RED)):
        result = make_result(e2e, frame, status)
        box = draw_overlay(frame, result, 30.0, 29.5, trained=True)[:12, -30:]
        assert colour_pixels(box, colour) > 200, status
        assert stats_of(result, 30.0, 29.5)["within_budget"] is (status == "ok")


def test_overlay_says_untrained():
    frame = np.full((SIZE[1], SIZE[0], 3), 40, np.uint8)
    out = draw_overlay(frame, make_result(12.0, frame), 30.0, 29.5, trained=False)
    assert colour_pixels(out[-20:], AMBER) > 1000  # the UNTRAINED WEIGHTS banner along the bottom


def test_the_mosaic_is_the_largest_frames_size_and_keeps_each_cameras_shape():
    """A 640x480 and a 320x240 camera: the mosaic is 640x480 (not the first camera's size), the small one scaled up
    into its tile; a 4:3 and a 16:9 camera keep their shapes (letterboxed), none squeezed."""
    small, large = np.full((240, 320, 3), 100, np.uint8), np.full((480, 640, 3), 100, np.uint8)
    assert mosaic({"s": small, "l": large}).shape == (480, 640, 3)
    wide = np.full((180, 320, 3), 100, np.uint8)  # 16:9 beside 4:3
    out = mosaic({"a": small, "w": wide})
    assert out.shape == (240, 320, 3)
    tile = out[:, 160:]  # 160x240 tile: the 16:9 frame is 160x90, centred, black above and below
    rows = np.flatnonzero(tile[:, 40:120].max(axis=(1, 2)) > 0)
    assert 85 <= rows.max() - rows.min() + 1 <= 95 and rows.min() > 60
