"""Cameras and streams: GStreamer pipelines as data (one builder per source kind, the element set a parameter)
and the captures that open them.

JETSON names the hardware blocks (nvarguscamerasrc, nvv4l2decoder, nvvidconv); SOFTWARE is the same pipeline
with software elements (v4l2src, avdec_h264/avdec_h265/jpegdec, videoconvert) for any other Linux. The tests
swap the camera sources for videotestsrc (the software twin) and run the very strings built here.
Every pipeline ends in a BGR appsink that keeps only the newest frame. Without a GStreamer-enabled OpenCV
(PyPI's opencv-python), USB cameras and RTSP go through OpenCV's own V4L2 and FFmpeg backends.
"""

import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from edge.board import is_jetson
from edge.config import SourceConfig
from edge.errors import EdgeError, require
from edge.sources.capture import Capture, OpenCVCapture
from edge.uri import SourceURI

APPSINK = "video/x-raw,format=BGR ! appsink drop=true max-buffers=1 sync=false"
# RTP payload -> elementary stream; `auto` lets parsebin plug the depayloader and parser the stream needs.
_DEPAY = {
    "auto": "parsebin",
    "h264": "rtph264depay ! h264parse",
    "h265": "rtph265depay ! h265parse",
    "mjpeg": "rtpjpegdepay ! jpegparse",
}
_NVDEC = "nvv4l2decoder enable-max-performance=1"


@dataclass(frozen=True)
class Elements:
    """The elements a pipeline is made of; placeholders {sensor} and {device} are filled in by the builders."""

    name: str
    csi: str  # CSI camera source ("" where there is none)
    v4l2: str  # USB camera source
    memory: str  # caps feature of the CSI camera's frames ("(memory:NVMM)" on a Jetson)
    decoders: Dict[str, str]  # source.rtsp_codec -> decoder; "mjpeg" also decodes USB MJPG
    to_bgr: str  # decoded frame -> system-memory BGR (APPSINK's caps follow)


JETSON = Elements(
    name="jetson",
    csi="nvarguscamerasrc sensor-id={sensor}",
    v4l2="v4l2src device={device}",
    memory="(memory:NVMM)",
    decoders={"auto": _NVDEC, "h264": _NVDEC, "h265": _NVDEC, "mjpeg": _NVDEC + " mjpeg=1"},
    to_bgr="nvvidconv ! video/x-raw,format=BGRx ! videoconvert",
)

SOFTWARE = Elements(
    name="software",
    csi="",
    v4l2="v4l2src device={device}",
    memory="",
    decoders={"auto": "decodebin", "h264": "avdec_h264", "h265": "avdec_h265", "mjpeg": "jpegdec"},
    to_bgr="videoconvert",
)


def _size(width: int, height: int, fps: float) -> str:
    return "width={},height={},framerate={}/1".format(width, height, int(round(fps)))


def csi_pipeline(sensor: int, width: int, height: int, fps: float, elements: Elements = JETSON) -> str:
    if not elements.csi:
        raise EdgeError("csi://{}: a CSI camera needs a Jetson (nvarguscamerasrc)".format(sensor))
    return "{} ! video/x-raw{},{},format=NV12 ! {} ! {}".format(
        elements.csi.format(sensor=sensor), elements.memory, _size(width, height, fps), elements.to_bgr, APPSINK)


def usb_pipelines(device: str, width: int, height: int, fps: float, elements: Elements) -> List[Tuple[str, str]]:
    """(format, pipeline) in order of preference: MJPG through the JPEG decoder, then raw YUYV (cameras
    without MJPG; converted on the CPU, as nvvidconv's system-memory input is not verified)."""
    source, size = elements.v4l2.format(device=device), _size(width, height, fps)
    return [
        ("MJPG", "{} ! image/jpeg,{} ! {} ! {} ! {}".format(source, size, elements.decoders["mjpeg"],
                                                            elements.to_bgr, APPSINK)),
        ("YUYV", "{} ! video/x-raw,format=YUY2,{} ! videoconvert ! {}".format(source, size, APPSINK)),
    ]


def rtsp_pipeline(uri: str, codec: str, tcp: bool, elements: Elements) -> str:
    """`latency=0`: frames leave the jitterbuffer at once; `tcp`: RTP interleaved in the RTSP connection. `uri` is
    quoted, and edge.uri.parse_source has refused the quotes, backslashes and spaces that could end the quote."""
    return "rtspsrc location=\"{}\" latency=0 drop-on-latency=true{} ! {} ! {} ! {} ! {}".format(
        uri, " protocols=tcp" if tcp else "", _DEPAY[codec], elements.decoders[codec], elements.to_bgr, APPSINK)


class GStreamerCapture(OpenCVCapture):
    """GStreamer pipelines through OpenCV, tried in order (USB: MJPG, then YUYV): the first that delivers a frame is
    kept (`target`), and `negotiated` and `description` name its format, frame size and frame rate."""

    def __init__(self, uri: SourceURI, candidates: List[Tuple[str, str]], elements: Elements, fps: float = 0.0):
        super().__init__(None, 0, uri.shown)
        self.uri, self.candidates, self.elements, self.fps = uri, candidates, elements.name, fps
        self.negotiated = ""

    def open(self) -> None:
        cv2 = require("cv2")
        if self.uri.protocol == "rtsp":
            _check_reachable(self.uri)
        for label, pipeline in self.candidates:
            cap = cv2.VideoCapture(pipeline, cv2.CAP_GSTREAMER)
            ok, image = cap.read() if cap.isOpened() else (False, None)
            if ok and image is not None:
                self.cap, self.target = cap, pipeline
                self.negotiated = "{} {}x{}{}".format(label, image.shape[1], image.shape[0],
                                                      "@{:g}".format(self.fps) if self.fps else "")
                self.description = "{} [{}, {}]".format(self.uri.shown, self.negotiated, self.elements)
                return
            cap.release()
        raise EdgeError("{}: cannot open source ({} pipeline, {})".format(
            self.uri.shown, self.elements, " or ".join(label for label, _ in self.candidates)))


def _check_reachable(uri: SourceURI, timeout_s: float = 1.0) -> None:
    """Refuse before GStreamer when the RTSP server does not accept connections: OpenCV (4.6) waits without a
    timeout for rtspsrc to start, and a refused connection racing that wait has been seen to hang it for good."""
    try:
        socket.create_connection((uri.location, uri.port), timeout_s).close()
    except OSError as exc:
        raise EdgeError("{}: cannot reach {}:{} ({})".format(uri.shown, uri.location, uri.port,
                                                             exc.strerror or exc)) from None


class V4L2Capture(OpenCVCapture):
    """A USB camera through OpenCV's V4L2 backend (an OpenCV without GStreamer): asks for MJPG at the configured
    size and fps; a camera without MJPG stays on its raw format, which `negotiated` names."""

    def __init__(self, index: int, uri: str, api: int, width: int, height: int, fps: float):
        super().__init__(index, api, uri)  # a device URI: nothing secret in it
        self.uri, self.width, self.height, self.fps = uri, width, height, fps
        self.negotiated = ""

    def open(self) -> None:
        cv2 = require("cv2")
        super().open()
        for prop, value in ((cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*"MJPG")),
                            (cv2.CAP_PROP_FRAME_WIDTH, self.width), (cv2.CAP_PROP_FRAME_HEIGHT, self.height),
                            (cv2.CAP_PROP_FPS, self.fps), (cv2.CAP_PROP_BUFFERSIZE, 1)):
            self.cap.set(prop, value)
        fourcc = int(self.cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode("latin-1")
        self.negotiated = "{} {}x{}@{:g}".format(fourcc, int(self.cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
                                                 int(self.cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                                                 self.cap.get(cv2.CAP_PROP_FPS))
        self.description = "{} [{}, opencv-v4l2]".format(self.uri, self.negotiated)


def _has_gstreamer(cv2: Any) -> bool:
    info = cv2.getBuildInformation()
    return any("GStreamer" in line and "YES" in line for line in info.splitlines())


def camera_capture(uri: SourceURI, cfg: SourceConfig) -> Capture:
    """`uri` (csi, rtsp or v4l2: `cfg.uri` parsed) -> a Capture (not yet opened): GStreamer with the board's
    element set when OpenCV has GStreamer, else OpenCV's own V4L2 and FFmpeg backends."""
    cv2 = require("cv2")
    gst = _has_gstreamer(cv2)
    elements = JETSON if is_jetson() else SOFTWARE
    if uri.protocol == "csi":
        if not gst:
            raise EdgeError("{}: this OpenCV has no GStreamer (PyPI's opencv-python does not); "
                            "on a Jetson use JetPack's python3-opencv".format(uri.text))
        pipeline = csi_pipeline(uri.device, cfg.width, cfg.height, cfg.fps, elements)
        return GStreamerCapture(uri, [("NV12", pipeline)], elements, cfg.fps)
    if uri.protocol == "rtsp":
        if not gst:  # OpenCV's FFmpeg backend: any codec, software decode, RTSP over TCP
            return OpenCVCapture(uri.text, cv2.CAP_FFMPEG, uri.shown)
        pipeline = rtsp_pipeline(uri.text, cfg.rtsp_codec, cfg.rtsp_tcp, elements)
        return GStreamerCapture(uri, [(cfg.rtsp_codec, pipeline)], elements)
    if not gst:  # v4l2
        return V4L2Capture(uri.device, uri.text, cv2.CAP_V4L2, cfg.width, cfg.height, cfg.fps)
    pipelines = usb_pipelines(uri.location, cfg.width, cfg.height, cfg.fps, elements)
    return GStreamerCapture(uri, pipelines, elements, cfg.fps)
