"""edge.sources.reader: the reader hands out the newest frame and counts the ones skipped, times out and forwards a
capture's errors, and reads into staging buffers never over a frame waiting or served."""

import threading
import time

import numpy as np
import pytest
import service_helpers as sh

from edge.sources.capture import Capture, SyntheticCapture
from edge.sources.source import SourceEnded


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


def test_reader_returns_newest_frame_and_counts_skips():
    reader = sh.CameraReader(CountingCapture(200))
    seen = []
    try:
        while True:
            seen.append(reader.get().seq)
            time.sleep(0.01)  # a slow consumer
    except SourceEnded:
        pass
    finally:
        reader.stop()
    assert all(b > a for a, b in zip(seen, seen[1:])), "a frame older than the previous one was returned"
    stats = reader.stats()
    assert stats["produced"] == 200
    assert stats["skipped"] > 100  # the slow consumer missed most frames
    assert stats["skipped"] == 200 - len(seen)


def test_reader_times_out_and_forwards_errors():
    class Stalled(Capture):
        description = "stalled"

        def open(self):
            self.release = threading.Event()

        def read(self):
            self.release.wait(5)
            return None

    stalled = Stalled()
    reader = sh.CameraReader(stalled, timeout_s=0.1)
    with pytest.raises(sh.SourceTimeout, match="no frame for 0.1 s"):
        reader.get(0.1)
    stalled.release.set()
    reader.stop()

    class Broken(Capture):
        description = "broken"

        def open(self):
            pass

        def read(self):
            raise IOError("camera unplugged")

    reader = sh.CameraReader(Broken())
    with pytest.raises(IOError, match="camera unplugged"):
        reader.get()
    reader.stop()


def test_the_reader_reads_into_staging_buffers_never_over_the_waiting_or_the_served_frame():
    """The GPU path's pinned buffers (CudaPreprocessor.staging_buffers): frames arrive in them, and while the
    batch served last holds one (until the next batch) and another waits in the camera's slot, reads go into the
    third."""
    buffers = [np.zeros((48, 64, 3), np.uint8) for _ in range(3)]
    reader = sh.CameraReader(SyntheticCapture(64, 48, fps=2000))
    reader.camera.set_staging(lambda height, width: buffers if (height, width) == (48, 64) else [])
    told = reader.stats()["produced"]
    try:
        assert sh.wait_until(lambda: reader.stats()["produced"] >= told + 2)  # reads begun since: staged
        reader.get()
        held = reader.get()
        assert any(held.image is b for b in buffers)
        kept = held.image.copy()
        sh.wait_until(lambda: reader.stats()["produced"] >= held.seq + 20)
        assert np.array_equal(held.image, kept)  # 20 reads later, the frame held is whole
        newer = reader.get()
        assert newer.image is not held.image and any(newer.image is b for b in buffers)
    finally:
        reader.stop()
