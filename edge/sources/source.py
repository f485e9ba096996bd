"""Frame sources: a URI -> a capture, and a Camera: its readers, its counters and its recovery carried out.

URIs (config `source.uri`, flag `--source`):
  synthetic                generated frames, paced at `source.fps`, `source.width`x`source.height`
  PATH.mp4 | PATH/         a video file or a folder of images, paced at `source.fps`, looping if `source.loop`
  /dev/videoN | v4l2://N   a V4L2 (USB) camera: MJPG at the configured size and fps, else raw YUYV
  csi://N                  a MIPI CSI camera (Jetson: nvarguscamerasrc -> nvvidconv -> BGR appsink)
  rtsp://...               an RTSP stream (H.264, H.265, MJPEG) through a low-latency pipeline
Cameras and streams are GStreamer pipelines (edge/sources/gstreamer.py) with the Jetson's hardware elements
on a Jetson and software ones elsewhere; an OpenCV without GStreamer falls back to its V4L2 and FFmpeg backends.

A Capture is a plain reader (open, read, close). The split of Frigate's CameraCapture and CameraWatchdog: a
FrameReader (edge/sources/reader.py) reads one capture in its own thread and publishes each frame into its camera's
slot; a Camera here owns the camera's readers, counters and figures, and carries out what its Watch
(edge/sources/watch.py, the one recovery policy) decides when the watcher thread (edge/sources/cameras.py) asks:
a failed live source (cameras, RTSP, synthetic) reopened by a new reader after a backoff
(`service.reconnect_initial_s` doubling up to `service.reconnect_max_s`), a `source_timeout` every `source.timeout_s`
without a frame, a reader whose read or open hung that long abandoned for a new one on a fresh capture, and a source
silent since start an error (`give_up_at_start`) or, under a supervisor that keeps the process (the systemd service:
a camera not there yet at boot), a `source_start_timeout` event and the same retries on. Files and image folders
are not live: their end is the end of the run.
"""

import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from edge.config import CameraConfig, SourceConfig
from edge.errors import EdgeError, require
from edge.infer.latency import LatencyRecorder
from edge.infer.pipeline import Frame
from edge.inputs import path_kind
from edge.sources.capture import (
    IMAGE_EXTENSIONS,
    Capture,
    ImageFolderCapture,
    OpenCVCapture,
    SourceEnded,
    SyntheticCapture,
)
from edge.sources.gstreamer import camera_capture
from edge.sources.reader import FrameReader, Staging
from edge.sources.watch import GIVE_UP, REOPEN, Backoff, SourceStats, Watch
from edge.uri import SourceURI, parse_source

__all__ = ["IMAGE_EXTENSIONS", "Camera", "Capture", "Frame", "SourceEnded", "SyntheticCapture",
           "open_capture"]


def open_capture(cfg: SourceConfig) -> Capture:
    """Map `cfg.uri` to a Capture (not yet opened); bad URIs and missing paths raise EdgeError naming the camera's
    key (`source.uri`, or `sources[i].uri`: edge.config's CameraConfig.key). The URI is parsed here once; the
    camera path gets the resource."""
    field = "{}.uri".format(getattr(cfg, "key", "source"))
    try:
        return _capture(parse_source(cfg.uri, field), cfg)
    except EdgeError as exc:
        text = str(exc)
        raise EdgeError(text if text.startswith(field) else "{} {}".format(field, text), exc.exit_code) from None


def _capture(resource: SourceURI, cfg: SourceConfig) -> Capture:
    if resource.protocol == "synthetic":
        return SyntheticCapture(cfg.width, cfg.height, cfg.fps)
    if resource.protocol != "file":
        return camera_capture(resource, cfg)
    uri = resource.location
    if os.path.isdir(uri):
        return ImageFolderCapture(uri, cfg.fps, cfg.loop)
    cv2 = require("cv2")
    if not os.path.isfile(uri):
        raise EdgeError("{}: {}".format(uri, "video file or image folder not found" if not os.path.lexists(uri) else
                                        "not a regular file or folder ({})".format(path_kind(uri))))
    if resource.extension in IMAGE_EXTENSIONS:
        raise EdgeError("{}: a single image is not a video source; put images in a folder".format(uri))
    return OpenCVCapture(uri, cv2.CAP_ANY, uri, fps=cfg.fps, loop=cfg.loop, is_file=True)


class Camera:
    """One camera of a run: its readers (one at a time, plus any abandoned while hung), its counters (SourceStats,
    kept across readers), its latency figures and its Watch. `publish(camera, frame)` takes its frames;
    `on_event(name, fields)` its events; `changed()` is told when its reader stops."""

    def __init__(self, index: int, cfg: CameraConfig, capture_factory: Callable[[Any], Capture], *,
                 publish: Callable[["Camera", Frame], None], on_event: Callable[[str, Dict[str, Any]], None],
                 changed: Callable[[], None], backoff: Backoff, give_up_at_start: bool, budget_ms: float,
                 window: int, label: str = ""):
        self.index, self.cfg, self.name = index, cfg, cfg.name
        self.label = label  # what its errors start with where there are several cameras: "sources[1] (left): "
        self.capture_factory, self._publish, self._on_event, self.changed = capture_factory, publish, on_event, changed
        self.stats = SourceStats()
        self.lock = threading.Lock()  # guards `stats`, across its readers
        self.recorder = LatencyRecorder(budget_ms, window)
        self.errors = 0  # its frames that failed in the stages
        self.watch = Watch(started=time.monotonic(), timeout_s=cfg.timeout_s, start_timeout_s=cfg.start_timeout_s,
                           backoff=backoff, give_up_at_start=give_up_at_start)
        self.held: List[Frame] = []  # its frames in the batch being served (never read over)
        self.slot: Optional[Frame] = None  # its frame waiting in the batcher
        self.staging: Optional[Staging] = None
        self.reader = self._reader(capture_factory(cfg))
        self.stopped = False

    @property
    def description(self) -> str:
        return self.reader.capture.description

    def _reader(self, capture: Capture) -> FrameReader:
        return FrameReader(capture, stats=self.stats, lock=self.lock, publish=lambda frame: self._publish(self, frame),
                           on_event=self.event, changed=self.changed, staging=self.staging, busy=self._busy)

    def _busy(self) -> List[Frame]:
        slot = self.slot
        return self.held + ([slot] if slot is not None else [])

    def set_staging(self, staging: Optional[Staging]) -> None:
        """The GPU preprocessor's page-locked buffers to read into (None: the capture's own arrays)."""
        self.staging = self.reader.staging = staging

    def start(self) -> "Camera":
        self.reader.start()
        return self

    def event(self, name: str, fields: Dict[str, Any]) -> None:
        """`on_event(name, fields)` with the camera's name and counters; reporting never takes a reader down."""
        try:
            self._on_event(name, dict(dict(fields, camera=self.name), **self.counters()))
        except Exception:
            pass

    def counters(self) -> Dict[str, int]:
        with self.lock:
            return self.stats.counters()

    def watch_once(self, now: float) -> Optional[float]:
        """Carry out what the Watch decides about the reader now; when to ask again. Raises EdgeError when it gives
        up (no first frame within start_timeout_s)."""
        if self.reader.ended or self.reader.error is not None:  # a file's end or error: nothing to watch
            return None
        verdict = self.watch.decide(now, self.reader.view())
        if verdict.action == GIVE_UP:
            raise EdgeError("{}{}: {}".format(self.label, self.description, verdict.error))
        source = self.description
        for name, fields in verdict.events:
            if name == "source_timeout":
                with self.lock:
                    self.stats.source_timeouts += 1
            if name == "source_start_timeout":
                fields = dict(fields, error="{}: {}".format(source, fields["error"]))
            self.event(name, dict(fields, source=source))
        if verdict.action == REOPEN and not self.stopped:
            old = self.reader
            if verdict.fresh:
                old.abandon()
            self.reader = self._reader(self.capture_factory(self.cfg) if verdict.fresh else old.capture)
            self.reader.start(reopen=True)
        return verdict.wake_at

    def figures(self) -> Dict[str, Any]:
        out: Dict[str, Any] = self.recorder.summary()
        out.update(self.counters(), errors=self.errors, source=self.description)
        return out

    def stop(self) -> None:
        self.stopped = True
        self.reader.stop()
