import threading
import time

import numpy as np
import pytest
import service_helpers as sh

from edge.config import SourceConfig, load_config
from edge.errors import EdgeError
from edge.sources.gstreamer import APPSINK, JETSON, SOFTWARE, csi_pipeline, rtsp_pipeline, usb_pipelines
from edge.sources.source import Capture, SourceEnded, open_capture

from conftest import write_video


def grab_all(cfg, limit=1000):
    reader = sh.CameraReader(open_capture(cfg))
    frames = []
    try:
        while len(frames) < limit:
            frames.append(reader.get())
    except SourceEnded:
        pass
    finally:
        reader.stop()
    return frames, reader.stats()


def test_video_file_frames_match_what_was_written(tmp_path):
    written = write_video(tmp_path / "clip.avi", frames=12)
    frames, stats = grab_all(SourceConfig(uri=str(tmp_path / "clip.avi"), fps=1000, loop=False))
    assert len(frames) + stats["skipped"] == 12
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
    (tmp_path / "notes.txt").write_text("not an image", encoding="utf-8")
    frames, stats = grab_all(SourceConfig(uri=str(tmp_path), fps=1000, loop=False))
    assert len(frames) + stats["skipped"] == 3
    assert all(f.image.shape == (50, 60, 3) for f in frames)


def test_a_folder_source_is_listed_as_a_path_and_only_its_files_are_images(tmp_path):
    """`cam[1]/` is the folder of that name (never a glob matching `cam1/`); a subfolder named like an image is
    skipped, not read (issue 19 item 10)."""
    import cv2

    folder, decoy = tmp_path / "cam[1]", tmp_path / "cam1"
    for path, value in ((folder, 200), (decoy, 10)):
        path.mkdir()
        cv2.imwrite(str(path / "a.png"), np.full((20, 30, 3), value, np.uint8))
    (folder / "sub.jpg").mkdir()
    (folder / "sub.jpg" / "inner.png").write_bytes(b"")
    frames, stats = grab_all(SourceConfig(uri=str(folder), fps=1000, loop=False))
    assert [int(f.image.mean()) for f in frames] == [200] and stats["broken"] == 0


def test_synthetic_source_is_paced():
    reader = sh.CameraReader(open_capture(SourceConfig(width=64, height=48, fps=50)))
    try:
        frames = [reader.get() for _ in range(10)]
    finally:
        reader.stop()
    assert frames[0].image.shape == (48, 64, 3)
    span = frames[-1].captured - frames[0].captured
    assert span >= 0.8 * 0.02 * (frames[-1].seq - frames[0].seq)  # never faster than 50 fps, however idle


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


def test_uri_errors():
    with pytest.raises(EdgeError, match="expected csi://N"):
        open_capture(SourceConfig(uri="csi://front"))
    with pytest.raises(EdgeError, match="single image is not a video source"):
        import tempfile
        with tempfile.NamedTemporaryFile(suffix=".jpg") as fh:
            open_capture(SourceConfig(uri=fh.name))


def test_jetson_pipelines_use_the_hardware_blocks_and_keep_only_the_newest_frame():
    csi = csi_pipeline(0, 1280, 720, 30)
    assert csi.startswith("nvarguscamerasrc sensor-id=0 ! video/x-raw(memory:NVMM),width=1280,height=720,"
                          "framerate=30/1,format=NV12 ! nvvidconv ! video/x-raw,format=BGRx ! videoconvert ! ")
    rtsp = rtsp_pipeline("rtsp://10.0.0.2/stream", "auto", True, JETSON)
    assert rtsp.startswith("rtspsrc location=\"rtsp://10.0.0.2/stream\" latency=0 drop-on-latency=true protocols=tcp "
                           "! parsebin ! nvv4l2decoder enable-max-performance=1 ! nvvidconv ! ")
    assert "! rtph265depay ! h265parse ! nvv4l2decoder " in rtsp_pipeline("rtsp://x", "h265", False, JETSON)
    assert "protocols" not in rtsp_pipeline("rtsp://x", "h265", False, JETSON)
    (mjpg, first), (yuyv, second) = usb_pipelines("/dev/video1", 1280, 720, 30, JETSON)
    assert (mjpg, yuyv) == ("MJPG", "YUYV")
    assert first.startswith("v4l2src device=/dev/video1 ! image/jpeg,width=1280,height=720,framerate=30/1 ! "
                            "nvv4l2decoder enable-max-performance=1 mjpeg=1 ! nvvidconv ! ")
    assert "! video/x-raw,format=YUY2,width=1280,height=720,framerate=30/1 ! videoconvert ! " in second
    assert all(p.endswith(" ! " + APPSINK) for p in (csi, rtsp, first, second))


def test_software_pipelines_are_the_same_builders_with_software_elements():
    assert "! rtph264depay ! h264parse ! avdec_h264 ! videoconvert ! " in rtsp_pipeline("rtsp://x", "h264", False,
                                                                                        SOFTWARE)
    assert "! parsebin ! decodebin ! videoconvert ! " in rtsp_pipeline("rtsp://x", "auto", False, SOFTWARE)
    assert "! image/jpeg,width=640,height=480,framerate=15/1 ! jpegdec ! videoconvert ! " in usb_pipelines(
        "/dev/video0", 640, 480, 15, SOFTWARE)[0][1]
    with pytest.raises(EdgeError, match=r"^csi://0: a CSI camera needs a Jetson"):
        csi_pipeline(0, 640, 480, 15, SOFTWARE)


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


def test_the_reader_reads_into_staging_buffers_never_over_the_waiting_or_the_served_frame():
    """The GPU path's pinned buffers (CudaPreprocessor.staging_buffers): frames arrive in them, and while the
    batch served last holds one (until the next batch) and another waits in the camera's slot, reads go into the
    third."""
    from edge.sources.capture import SyntheticCapture

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
