import threading
import time

import numpy as np
import pytest

from edge.config import SourceConfig
from edge.errors import EdgeError
from edge.frame.sources import (
    Capture,
    LatestFrameGrabber,
    SourceEnded,
    SourceTimeout,
    csi_pipeline,
    open_capture,
    rtsp_pipeline,
)

from conftest import write_video


def grab_all(cfg, limit=1000):
    grabber = LatestFrameGrabber(open_capture(cfg)).start()
    frames = []
    try:
        while len(frames) < limit:
            frames.append(grabber.get())
    except SourceEnded:
        pass
    finally:
        grabber.stop()
    return frames, grabber


def test_video_file_frames_match_what_was_written(tmp_path):
    written = write_video(tmp_path / "clip.avi", frames=12)
    frames, grabber = grab_all(SourceConfig(uri=str(tmp_path / "clip.avi"), fps=1000, loop=False))
    assert len(frames) + grabber.skipped == 12
    assert [f.seq for f in frames] == sorted(f.seq for f in frames)
    first = frames[0]
    assert first.image.shape == (240, 320, 3) and first.image.dtype == np.uint8
    # MJPG is lossy: close to what was written, not equal
    assert np.abs(first.image.astype(int) - written[first.seq - 1]).mean() < 6


def test_video_file_loops(tmp_path):
    write_video(tmp_path / "clip.avi", frames=5)
    frames, _ = grab_all(SourceConfig(uri=str(tmp_path / "clip.avi"), fps=2000, loop=True), limit=14)
    assert len(frames) == 14


def test_image_folder_reads_images_and_skips_non_images(tmp_path):
    import cv2

    for i in range(3):
        cv2.imwrite(str(tmp_path / "img{}.png".format(i)), np.full((50, 60, 3), i * 80, np.uint8))
    (tmp_path / "notes.txt").write_text("not an image")
    frames, grabber = grab_all(SourceConfig(uri=str(tmp_path), fps=1000, loop=False))
    assert len(frames) + grabber.skipped == 3
    assert all(f.image.shape == (50, 60, 3) for f in frames)


def test_synthetic_source_is_paced():
    grabber = LatestFrameGrabber(open_capture(SourceConfig(width=64, height=48, fps=50))).start()
    try:
        start = time.monotonic()
        frames = [grabber.get() for _ in range(10)]
        elapsed = time.monotonic() - start
    finally:
        grabber.stop()
    assert frames[0].image.shape == (48, 64, 3)
    assert 0.12 < elapsed < 1.0  # 10 frames at 50 fps ~ 0.2 s


class CountingCapture(Capture):
    """Produces frames as fast as it can, each stamped with its index."""

    description = "counting"

    def __init__(self, total):
        self.total, self.n = total, 0

    def open(self):
        pass

    def read(self):
        if self.n >= self.total:
            return None
        self.n += 1
        time.sleep(0.001)
        return np.full((4, 4, 3), self.n % 256, np.uint8)


def test_grabber_returns_newest_frame_and_counts_skips():
    grabber = LatestFrameGrabber(CountingCapture(200)).start()
    seen = []
    try:
        while True:
            seen.append(grabber.get().seq)
            time.sleep(0.01)  # a slow consumer
    except SourceEnded:
        pass
    finally:
        grabber.stop()
    assert all(b > a for a, b in zip(seen, seen[1:])), "a frame older than the previous one was returned"
    assert grabber.produced == 200
    assert grabber.skipped > 100  # the slow consumer missed most frames
    assert grabber.skipped == 200 - len(seen)


def test_grabber_times_out_and_forwards_errors():
    class Stalled(Capture):
        description = "stalled"

        def open(self):
            self.release = threading.Event()

        def read(self):
            self.release.wait(5)
            return None

    stalled = Stalled()
    grabber = LatestFrameGrabber(stalled, timeout_s=0.1).start()
    with pytest.raises(SourceTimeout, match="no frame for 0.1 s"):
        grabber.get()
    stalled.release.set()
    grabber.stop()

    class Broken(Capture):
        description = "broken"

        def open(self):
            pass

        def read(self):
            raise IOError("camera unplugged")

    grabber = LatestFrameGrabber(Broken()).start()
    with pytest.raises(IOError, match="camera unplugged"):
        grabber.get()
    grabber.stop()


def test_uri_errors():
    with pytest.raises(EdgeError, match="expected csi://N"):
        open_capture(SourceConfig(uri="csi://front"))
    with pytest.raises(EdgeError, match="single image is not a video source"):
        import tempfile
        with tempfile.NamedTemporaryFile(suffix=".jpg") as fh:
            open_capture(SourceConfig(uri=fh.name))


def test_gstreamer_pipelines_drop_stale_frames():
    csi = csi_pipeline(0, 1280, 720, 30)
    assert csi.startswith("nvarguscamerasrc sensor-id=0 ")
    assert "nvvidconv" in csi and "format=BGR ! appsink drop=true max-buffers=1 sync=false" in csi
    for on_jetson in (True, False):
        rtsp = rtsp_pipeline("rtsp://10.0.0.2/stream", on_jetson)
        assert "latency=0" in rtsp and rtsp.endswith("appsink drop=true max-buffers=1 sync=false")
    assert "nvv4l2decoder" in rtsp_pipeline("rtsp://x", True)
