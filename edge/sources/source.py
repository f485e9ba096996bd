"""Frame sources: a URI -> a capture, and the supervisor of the reader thread that keeps only the newest frame.

URIs (config `source.uri`, flag `--source`):
  synthetic                generated frames, paced at `source.fps`, `source.width`x`source.height`
  PATH.mp4 | PATH/         a video file or a folder of images, paced at `source.fps`, looping if `source.loop`
  /dev/videoN | v4l2://N   a V4L2 (USB) camera: MJPG at the configured size and fps, else raw YUYV
  csi://N                  a MIPI CSI camera (Jetson: nvarguscamerasrc -> nvvidconv -> BGR appsink)
  rtsp://...               an RTSP stream (H.264, H.265, MJPEG) through a low-latency pipeline
Cameras and streams are GStreamer pipelines (edge/sources/gstreamer.py) with the Jetson's hardware elements
on a Jetson and software ones elsewhere; an OpenCV without GStreamer falls back to its V4L2 and FFmpeg backends.

A Capture is a plain reader (open, read, close). The split of Frigate's CameraCapture and CameraWatchdog: a
FrameReader (edge/sources/reader.py) reads one capture in its own thread into a single slot and closes and reopens a
live one (cameras, RTSP, synthetic) with exponential backoff (`service.reconnect_initial_s` doubling up to
`service.reconnect_max_s`) when a read raises, returns nothing or keeps returning broken images; the
SourceSupervisor here owns that reader and the quiet-source policy of `next_frame()`, the loop's only call: a
`source_timeout` every `source.timeout_s` without a frame, a reader whose read or reopening hung that long replaced
by a fresh one on a fresh capture, and a source silent since start an error (`give_up_at_start`) or, under a
supervisor that keeps the process (the systemd service: a camera not there yet at boot), a `source_start_timeout`
event and the same retries on. Files and image folders are not live: their end is the end of the run.
"""

import math
import os
import time
from typing import Any, Callable, Dict, Optional

from edge.config import SourceConfig
from edge.errors import EdgeError, require
from edge.infer.pipeline import Frame
from edge.inputs import path_kind
from edge.sources.capture import (
    IMAGE_EXTENSIONS,
    Capture,
    ImageFolderCapture,
    OpenCVCapture,
    SourceEnded,
    SourceTimeout,
    SyntheticCapture,
)
from edge.sources.gstreamer import camera_capture
from edge.sources.reader import FrameReader
from edge.uri import SourceURI, parse_source

__all__ = ["IMAGE_EXTENSIONS", "Capture", "Frame", "SourceEnded",
           "SourceSupervisor", "SourceTimeout", "SyntheticCapture", "open_capture"]


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


class SourceSupervisor:
    """Owns the FrameReader of one source and the policy around it: `next_frame()` reports a quiet source,
    replaces a reader whose read hung with a fresh one on `reopen()`'s capture, and fails a source that never gave
    a first frame; `stats()` merges the reader's counters with its own. Events go to `on_event(name, fields)`.
    """

    def __init__(self, capture: Capture, timeout_s: float = 2.0, reconnect_initial_s: Optional[float] = None,
                 reconnect_max_s: float = 30.0, reopen: Optional[Callable[[], Capture]] = None,
                 on_event: Optional[Callable[[str, Dict[str, Any]], None]] = None, max_broken: int = 5,
                 start_timeout_s: float = 10.0, give_up_at_start: bool = True):
        self.reader = FrameReader(capture, timeout_s, reconnect_initial_s, reconnect_max_s, on_event, max_broken)
        self.timeout_s = timeout_s
        self.start_timeout_s = max(start_timeout_s, timeout_s)  # a source silent this long after start is dead
        self.give_up_at_start = give_up_at_start  # False: say so once (source_start_timeout) and keep retrying
        self._start_reported = False
        self.reopen = reopen  # builds a fresh Capture when a hung reader has to be abandoned
        self.timeouts = 0  # source_timeout events: `timeout_s` without a frame
        self._stopped = False
        self._started_at = time.monotonic()
        self._last_frame_at = self._started_at  # moved on by each timeout reported
        self._down_since: Optional[float] = None
        self._seen_frame = False
        self._last_timeout_log = -math.inf

    @property
    def description(self) -> str:
        return self.capture.description

    def facts(self) -> Dict[str, Any]:
        """What the start line adds for this source: nothing for one camera (edge.sources.cameras has several)."""
        return {}

    def figures(self) -> Dict[str, Any]:
        """What reports add for this source: nothing for one camera (its figures are the run's)."""
        return {}

    @property
    def capture(self) -> Capture:
        """The capture being read now (a fresh one after a hung read was abandoned)."""
        return self.reader.capture

    def start(self) -> "SourceSupervisor":
        self.reader.start()
        return self

    def stalled_for(self) -> float:
        """Seconds the current read (or reopening) has been blocked (0 when none is)."""
        return self.reader.stalled_for()

    def recover_stall(self) -> bool:
        """Abandon a reader whose read has been blocked for longer than `timeout_s` (an open or reopening: longer
        than `start_timeout_s`, as a camera may take seconds to open, more on a loaded machine) for a fresh one on
        a fresh capture (live sources with `reopen` only). The hung reader closes its capture when its call
        returns."""
        hung = self.reader
        limit = self.start_timeout_s if hung.opening else self.timeout_s
        if not hung.recovers or self.reopen is None or self._stopped or self.stalled_for() < limit:
            return False
        hung.abandon()
        self.reader = hung.successor(self.reopen()).start(reconnect=True)
        return True

    def next_frame(self, wait_s: float) -> Optional[Frame]:
        """The newest unseen frame within `wait_s`, else None: the caller serves its signals, then asks again.

        Each `timeout_s` without a frame is a `source_timeout` event (and a read hung that long is abandoned for a
        fresh reader); no first frame within `start_timeout_s` is an EdgeError naming the last fault (with
        `give_up_at_start`; else a `source_start_timeout` event), and the frame that ends an outage logs
        `source_recovered`. Raises SourceEnded at the end of a file or folder."""
        try:
            frame = self.reader.get(wait_s)
        except SourceTimeout:
            self._quiet(time.monotonic())
            return None
        now = time.monotonic()
        if self._down_since is not None:
            self.reader.emit("source_recovered", source=self.capture.description,
                             down_s=round(now - self._down_since, 2), **self.stats())
            self._down_since = None
        self._seen_frame, self._last_frame_at = True, now
        return frame

    def _quiet(self, now: float) -> None:
        quiet_s = now - self._last_frame_at
        if not self._seen_frame and not self._start_reported and now - self._started_at >= self.start_timeout_s:
            fault = self.reader.last_fault
            error = "{}: no frame within {:g} s of start{}".format(
                self.capture.description, self.start_timeout_s, " (last fault: {})".format(fault) if fault else "")
            if self.give_up_at_start:
                raise EdgeError(error)
            self._start_reported = True
            self.reader.emit("source_start_timeout", source=self.capture.description, error=error,
                             action="retrying with backoff", **self.stats())
        if quiet_s < self.timeout_s:
            return
        if self._down_since is None:
            self._down_since = self._last_frame_at
        self._last_frame_at = now  # the next timeout is `timeout_s` from this one
        self.timeouts += 1
        restarted = self.recover_stall()
        if self.timeouts <= 3 or restarted or now - self._last_timeout_log >= 30.0:  # then every 30 s
            self._last_timeout_log = now
            self.reader.emit("source_timeout", source=self.capture.description,
                             down_s=round(now - self._down_since, 1), hung_read_restarted=restarted, **self.stats())

    def stats(self) -> Dict[str, int]:
        return dict(self.reader.stats(), source_timeouts=self.timeouts)

    def stop(self) -> None:
        self._stopped = True
        self.reader.stop()
