"""edge.sources.source: a URI opens its capture (parsed once, refused in one line), and a camera's watcher replaces
a reader whose open or read hangs, its counts going on across readers."""

import threading
import time

import numpy as np
import pytest
import service_helpers as sh

from edge.config import SourceConfig, load_config
from edge.errors import EdgeError
from edge.sources.source import Capture, open_capture


def test_uri_errors():
    with pytest.raises(EdgeError, match="expected csi://N"):
        open_capture(SourceConfig(uri="csi://front"))
    with pytest.raises(EdgeError, match="single image is not a video source"):
        import tempfile
        with tempfile.NamedTemporaryFile(suffix=".jpg") as fh:
            open_capture(SourceConfig(uri=fh.name))


def test_rtsp_options_are_validated(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("source:\n  rtsp_codec: vp9\n", encoding="utf-8")
    with pytest.raises(EdgeError, match=r"bad.yaml: 'source.rtsp_codec' must be one of auto\|h264\|h265\|mjpeg"):
        load_config(str(config))
    config.write_text("source:\n  rtsp_tcp: yes please\n", encoding="utf-8")
    with pytest.raises(EdgeError, match=r"'source.rtsp_tcp' must be true or false"):
        load_config(str(config))


def test_an_opencv_without_gstreamer_uses_its_own_backends():
    cv2 = pytest.importorskip("cv2")
    if "YES" in [line for line in cv2.getBuildInformation().splitlines() if "GStreamer" in line][0]:
        pytest.skip("this OpenCV has GStreamer (tests/test_gstreamer.py covers it)")
    with pytest.raises(EdgeError, match=r"csi://0: this OpenCV has no GStreamer"):
        open_capture(SourceConfig(uri="csi://0"))
    assert open_capture(SourceConfig(uri="rtsp://127.0.0.1:9/x")).api == cv2.CAP_FFMPEG
    usb = open_capture(SourceConfig(uri="v4l2://57"))
    with pytest.raises(EdgeError, match=r"^v4l2://57: cannot open source$"):
        usb.open()


def test_the_uri_is_parsed_once_and_its_resource_reaches_the_camera_path(monkeypatch):
    from edge.sources import source as sources

    parsed, seen = [], []
    real = sources.parse_source
    monkeypatch.setattr(sources, "parse_source", lambda uri, field: parsed.append(uri) or real(uri, field))
    monkeypatch.setattr(sources, "camera_capture", lambda resource, cfg: seen.append(resource))
    open_capture(SourceConfig(uri="v4l2://57"))
    assert parsed == ["v4l2://57"] and [(r.protocol, r.location, r.device) for r in seen] == [
        ("v4l2", "/dev/video57", 57)]


class HangingOpen(Capture):
    """A camera whose open() blocks in the driver until `release` is set (OpenCV's rtspsrc open can)."""

    live = True
    description = "hanging open"

    def __init__(self, release):
        self.release = release

    def open(self):
        self.release.wait(30)

    def read(self):
        time.sleep(0.01)
        return np.zeros((4, 4, 3), np.uint8)


def stalled_for(reader):
    busy = reader.camera.reader.view().busy_since
    return time.monotonic() - busy if busy is not None else 0.0


def test_a_live_capture_whose_open_hangs_does_not_block_start():
    release = threading.Event()
    started = time.monotonic()
    reader = sh.CameraReader(HangingOpen(release), timeout_s=0.2)
    try:
        assert time.monotonic() - started < 10  # not the open's 30 s: the loop gets control back, its deadline acts
        with pytest.raises(sh.SourceTimeout):
            reader.get(0.3)
        assert stalled_for(reader) >= 0.3  # the hung open is seen as a stall (the watcher could abandon it)
        release.set()
        assert reader.get(2.0).image.shape == (4, 4, 3)
        assert reader.stats()["faults"] == 0 and reader.stats()["reconnects"] == 0  # a slow first open: no fault
    finally:
        release.set()
        reader.stop()


def test_a_slow_first_open_is_waited_for_not_abandoned_as_a_hung_read():
    """A camera may take seconds to open (nvargus at boot, a machine under load): an open is given
    start_timeout_s, not the read's timeout_s, before the watcher replaces the reader."""
    release, made = threading.Event(), []

    def camera():
        made.append(HangingOpen(release))
        return made[-1]

    reader = sh.CameraReader(camera, timeout_s=0.2, start_timeout_s=60.0)
    first = reader.camera.reader
    try:
        assert sh.wait_until(lambda: stalled_for(reader) >= 1.0, 60)  # five read timeouts into the open
        assert reader.camera.reader is first and len(made) == 1  # still the first open, not abandoned
        release.set()
        assert reader.get(60) is not None and reader.stats()["faults"] == 0
    finally:
        release.set()
        reader.stop()


def test_a_hung_reader_is_replaced_and_the_counts_go_on_across_readers():
    sh.HangingCapture.instances = []
    reader = sh.CameraReader(lambda: sh.HangingCapture(good=5), timeout_s=1.0, reconnect_initial_s=0.01)
    hung = reader.camera.reader
    try:
        seqs = [reader.get(60).seq for _ in range(15)]  # 5 frames before the read hangs, 10 after
        assert sh.wait_until(lambda: "source_recovered" in reader.names(), 60)
    finally:
        sh.HangingCapture.instances[0].release.set()
        reader.stop()
    assert reader.camera.reader is not hung and reader.camera.reader.capture is sh.HangingCapture.instances[1]
    assert all(b > a for a, b in zip(seqs, seqs[1:]))  # frames numbered on across readers
    stats = reader.stats()
    assert stats["faults"] == 1 and stats["reconnects"] == 1 and stats["source_timeouts"] >= 1
    events = reader.events
    assert [f["fault"] for name, f in events if name == "source_fault"] == ["hung"]
    assert any(f["hung_read_restarted"] for name, f in events if name == "source_timeout")
    assert reader.names().count("source_reconnected") == 1 and reader.names().count("source_recovered") == 1
