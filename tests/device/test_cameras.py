"""On a Jetson: the hardware pipelines edge builds (nvarguscamerasrc, nvv4l2decoder, nvvidconv) deliver frames.

`pytest -m jetson tests/device/test_cameras.py` in the Jetson venv (made with --system-site-packages, so JetPack's
GStreamer-enabled python3-opencv is used in-process). Cameras are optional: EDGE_TEST_CSI=N for a CSI sensor,
EDGE_TEST_USB=/dev/videoN for a USB camera; the RTSP test serves tests/rtsp_server.py on the device itself
(needs python3-gi, gir1.2-gst-rtsp-server-1.0 and x264enc/x265enc from gstreamer1.0-plugins-ugly/-bad).
"""

import os
import shutil
import subprocess
import sys
import time

import pytest
import service_helpers as sh

from edge.config import SourceConfig
from edge.sources.source import open_capture

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.jetson


@pytest.fixture(autouse=True)
def hardware_elements():
    if not shutil.which("gst-inspect-1.0") or subprocess.run(["gst-inspect-1.0", "nvv4l2decoder"],
                                                              capture_output=True).returncode:
        pytest.skip("no nvv4l2decoder: not a JetPack GStreamer")


def grab(cfg, frames=30):
    reader = sh.CameraReader(open_capture(cfg), cfg.timeout_s)
    try:
        start = time.monotonic()
        got = [reader.get(cfg.timeout_s) for _ in range(frames)]
        return reader.camera.reader.capture, got, frames / (time.monotonic() - start)
    finally:
        reader.stop()


def test_csi_camera_through_nvarguscamerasrc():
    sensor = os.environ.get("EDGE_TEST_CSI")
    if sensor is None:
        pytest.skip("set EDGE_TEST_CSI=N for a CSI camera")
    capture, frames, fps = grab(SourceConfig(uri="csi://" + sensor, width=1280, height=720, fps=30))
    assert "nvarguscamerasrc" in capture.target and capture.negotiated == "NV12 1280x720@30"
    assert frames[-1].image.shape == (720, 1280, 3) and fps > 25


def test_usb_camera_mjpg_decoded_by_the_hardware():
    device = os.environ.get("EDGE_TEST_USB")
    if device is None:
        pytest.skip("set EDGE_TEST_USB=/dev/videoN for a USB camera")
    capture, frames, fps = grab(SourceConfig(uri=device, width=1280, height=720, fps=30))
    print(capture.description, "{:.1f} fps".format(fps))
    assert capture.negotiated.startswith(("MJPG 1280x720", "YUYV 1280x720"))
    if capture.negotiated.startswith("MJPG"):
        assert "nvv4l2decoder enable-max-performance=1 mjpeg=1" in capture.target and fps > 25


@pytest.mark.parametrize("served, codec", [("h264", "auto"), ("h265", "auto"), ("h265", "h265"), ("mjpeg", "mjpeg")])
def test_rtsp_each_codec_through_nvv4l2decoder(served, codec):
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "rtsp_server.py"), "--port", "8654", "--codec",
                               served, "--width", "1280", "--height", "720"], stdout=subprocess.PIPE,
                               encoding="utf-8", errors="replace")
    try:
        assert server.stdout.readline().startswith("ready "), "tests/rtsp_server.py did not start"
        uri = "rtsp://127.0.0.1:8654/cam"
        capture, frames, _ = grab(SourceConfig(uri=uri, rtsp_codec=codec, rtsp_tcp=True))
    finally:
        server.terminate()
        server.wait(10)
    assert "nvv4l2decoder enable-max-performance=1" in capture.target
    assert capture.description == "{} [{} 1280x720, jetson]".format(uri, codec)
    assert frames[-1].image.shape == (720, 1280, 3)


def test_csi_survives_an_nvargus_daemon_restart():
    """The usual fix for a stuck camera: restarting nvargus-daemon makes a new /tmp/argus_socket. A process that
    reopens the camera (the service's reconnect) must reach the new daemon (systemd/jetson-edge.service has no
    private /tmp for that reason); `edge doctor` says the socket answers again. Needs root (systemctl)."""
    sensor = os.environ.get("EDGE_TEST_CSI")
    if sensor is None or os.geteuid() != 0:
        pytest.skip("set EDGE_TEST_CSI=N and run as root (it restarts nvargus-daemon)")
    from edge.cli.doctor import check_argus_socket

    cfg = SourceConfig(uri="csi://" + sensor, width=1280, height=720, fps=30)
    grab(cfg, frames=5)
    before = os.stat("/tmp/argus_socket").st_ino
    subprocess.run(["systemctl", "restart", "nvargus-daemon"], check=True, timeout=60)
    deadline = time.monotonic() + 30
    while check_argus_socket(True)[0] != "ok":  # the event the test needs: the new daemon answers
        assert time.monotonic() < deadline, "nvargus-daemon did not come back within 30 s"
        time.sleep(0.2)
    assert os.stat("/tmp/argus_socket").st_ino != before  # a new socket, as the unit's layout expects
    _, frames, _ = grab(cfg, frames=5)
    assert frames[-1].image.shape == (720, 1280, 3)
