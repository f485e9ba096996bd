"""edge.service.demo_stream: the overlay sink draws each camera's tile, and a JPEG is encoded only when someone waits
for one."""

import queue
import threading

import numpy as np
import service_helpers as sh
from test_overlay import make_result

from edge.service.demo_stream import FrameHub, OverlaySink
from edge.service.overlay import MIN_TILE


def test_the_mosaic_takes_a_camera_smaller_than_its_grid():
    """Two 1x1 cameras: a 0 px tile made cv2.resize assert and the demo died; each tile is at least MIN_TILE."""
    sink = OverlaySink(30.0, trained=True)
    for camera, colour in (("a", 200), ("b", 90)):
        result = make_result(12.0, np.full((1, 1, 3), colour, np.uint8))
        result.camera = camera
        sink.on_result(result)
    assert sink.last.shape == (MIN_TILE[0], 2 * MIN_TILE[1], 3)
    middle = sink.last[MIN_TILE[0] // 2]  # the 1x1 frame fills a square, centred in its tile, black beside it
    assert middle[MIN_TILE[1] // 2].any() and middle[MIN_TILE[1] + MIN_TILE[1] // 2].any()
    assert not middle[:10].any() and not middle[MIN_TILE[1] - 10:MIN_TILE[1] + 10].any()


def test_jpeg_is_encoded_only_when_someone_waits():
    hub = FrameHub()
    sink = OverlaySink(30.0, trained=True, hub=hub)
    for _ in range(10):  # nobody watching: one JPEG (for /frame.jpg), then none for a second
        sink.on_result(make_result(10.0))
    assert hub.encoded == 1 and hub.stats["frame"] == 7 and hub.stats["within_budget"] is True
    got = queue.Queue()
    waiter = threading.Thread(target=lambda: got.put(hub.next_jpeg(hub.jpeg_seq, timeout_s=30)))
    waiter.start()
    assert sh.wait_until(lambda: hub.waiting == 1, 30)
    sink.on_result(make_result(50.0, status="miss"))
    waiter.join(30)
    seq, jpeg = got.get_nowait()
    assert hub.encoded == 2 and seq == 2 and jpeg[:2] == b"\xff\xd8"
    assert hub.stats["within_budget"] is False
