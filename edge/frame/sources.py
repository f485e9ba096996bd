"""Frame sources: a URI -> a capture, and a grabber thread that keeps only the newest frame.

URIs (config `source.uri`, flag `--source`):
  synthetic                generated frames, paced at `source.fps`, `source.width`x`source.height`
  PATH.mp4 | PATH/         a video file or a folder of images, paced at `source.fps`, looping if `source.loop`
  /dev/videoN | v4l2://N   a V4L2 (USB) camera: MJPG at the configured size and fps, else raw YUYV
  csi://N                  a MIPI CSI camera (Jetson: nvarguscamerasrc -> nvvidconv -> BGR appsink)
  rtsp://...               an RTSP stream (H.264, H.265, MJPEG) through a low-latency pipeline
Cameras and streams are GStreamer pipelines (edge/frame/gstreamer.py) with the Jetson's hardware elements
on a Jetson and software ones elsewhere; an OpenCV without GStreamer falls back to its V4L2 and FFmpeg backends.

A Capture is a plain reader (open, read, close). LatestFrameGrabber is the one supervisor around it (the split of
Frigate's CameraCapture and CameraWatchdog): it reads in its own thread into a single slot, so no queue builds up
(the pipeline always gets the newest frame; frames it never saw are counted as skipped), and it owns every
recovery policy. Live sources (cameras, RTSP, synthetic), given a reconnect policy: a read that raises, returns
nothing, or keeps returning broken images closes the capture and reopens it with exponential backoff
(`service.reconnect_initial_s` doubling up to `service.reconnect_max_s`). `next_frame()`, the loop's only call,
adds the quiet-source policy: a `source_timeout` every `source.timeout_s` without a frame, a read or reopening
hung that long abandoned for a fresh capture beside it, and a dead source at start an error. Files and image
folders are not live: their end is the end of the run.
"""

import math
import os
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from edge.config import SourceConfig
from edge.errors import EdgeError, require
from edge.frame.capture import (
    IMAGE_EXTENSIONS,
    Capture,
    Frame,
    ImageFolderCapture,
    OpenCVCapture,
    SourceEnded,
    SourceTimeout,
    SyntheticCapture,
    broken_image,
)
from edge.frame.gstreamer import camera_capture
from edge.uri import parse_source

FIRST_FRAME_TIMEOUT_S = 10.0  # a source silent this long after start (or source.timeout_s if longer) is dead


def open_capture(cfg: SourceConfig) -> Capture:
    """Map `cfg.uri` to a Capture (not yet opened); bad URIs and missing paths raise EdgeError."""
    parsed = parse_source(cfg.uri)
    uri = parsed.text
    if parsed.kind == "synthetic":
        return SyntheticCapture(cfg.width, cfg.height, cfg.fps)
    if parsed.kind != "path":
        return camera_capture(cfg)
    if os.path.isdir(uri):
        return ImageFolderCapture(uri, cfg.fps, cfg.loop)
    cv2 = require("cv2")
    if not os.path.isfile(uri):
        raise EdgeError("{}: video file or image folder not found".format(uri))
    if uri.lower().endswith(IMAGE_EXTENSIONS):
        raise EdgeError("{}: a single image is not a video source; put images in a folder".format(uri))
    return OpenCVCapture(uri, cv2.CAP_ANY, uri, fps=cfg.fps, loop=cfg.loop, is_file=True)


class LatestFrameGrabber:
    """Reads a Capture in a thread; `get()` returns the newest frame the caller has not seen yet.

    With `reconnect_initial_s` set and a live capture, read errors, a lost stream (read() -> None) and
    `max_broken` broken images in a row are faults: the capture is closed and reopened with exponential
    backoff, `faults` and `reconnects` count them and `on_event(name, fields)` reports them (and the quiet-source
    events of `next_frame()`). Without it
    (files, tests) an error is raised to the consumer and None ends the source, as before.
    """

    def __init__(self, capture: Capture, timeout_s: float = 2.0, reconnect_initial_s: Optional[float] = None,
                 reconnect_max_s: float = 30.0, reopen: Optional[Callable[[], Capture]] = None,
                 on_event: Optional[Callable[[str, Dict[str, Any]], None]] = None, max_broken: int = 5):
        self.capture = capture
        self.timeout_s = timeout_s
        self.reconnect_initial_s = reconnect_initial_s
        self.reconnect_max_s = max(reconnect_max_s, reconnect_initial_s or 0.0)
        self.reopen = reopen  # builds a fresh Capture when a hung read has to be abandoned
        self.on_event = on_event
        self.max_broken = max_broken
        self._cond = threading.Condition()
        self._latest: Optional[Frame] = None
        self._delivered_seq = 0
        self._ended = False
        self._error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._generation = 0  # bumped when a hung reader is abandoned; the old thread then exits on its own
        self._read_started: Optional[float] = None
        self.produced = 0
        self.skipped = 0
        self.broken = 0  # images rejected as broken (never handed to the pipeline)
        self.faults = 0  # live-source failures: read errors, lost stream, broken streaks, hung reads
        self.reconnects = 0  # successful reopenings after a fault
        self.timeouts = 0  # source_timeout events: `timeout_s` without a frame
        self.last_fault: Optional[str] = None  # the latest fault's error, named when no first frame comes
        self._started_at = time.monotonic()
        self._last_frame_at = self._started_at  # moved on by each timeout reported
        self._down_since: Optional[float] = None
        self._seen_frame = False
        self._last_timeout_log = -math.inf

    @property
    def recovers(self) -> bool:
        return self.reconnect_initial_s is not None and bool(getattr(self.capture, "live", False))

    def start(self) -> "LatestFrameGrabber":
        if self.recovers:  # opened by the reader: an open that hangs in a driver is a stall the loop can see
            self._start_thread(self._generation, self.capture, None)
        else:  # files, folders: a bad one is an error here and now
            self.capture.open()
            self._start_thread(self._generation, self.capture, False)
        return self

    def _open_first(self, generation: int, capture: Capture) -> bool:
        """The first open of a live capture; a camera that is not there yet is a fault, retried with backoff."""
        try:
            self._timed(generation, capture.open)
            return True
        except Exception as exc:
            self._fault("open", exc)
            return False

    def _start_thread(self, generation: int, capture: Capture, needs_open: Optional[bool]) -> None:
        self._thread = threading.Thread(target=self._run, args=(generation, capture, needs_open),
                                        name="edge-grabber", daemon=True)
        self._thread.start()

    def _emit(self, event: str, **fields: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event, fields)
            except Exception:  # reporting must never take the reader down
                pass

    def _fault(self, kind: str, detail: Any) -> None:
        error = detail if isinstance(detail, str) else str(detail) if isinstance(detail, EdgeError) else \
            "{}: {}".format(type(detail).__name__, detail)
        with self._cond:
            self.faults += 1
            self.last_fault = error
        self._emit("source_fault", source=self.capture.description, fault=kind, error=error, faults=self.faults)

    def _current(self, generation: int) -> bool:
        return generation == self._generation and not self._stop.is_set()

    def _run(self, generation: int, capture: Capture, needs_open: Optional[bool]) -> None:
        """Read until stopped. `needs_open`: None for the first open of a live capture, True to reopen one."""
        delay = self.reconnect_initial_s or 0.0
        broken_streak = 0
        try:
            if needs_open is None:
                needs_open = not self._open_first(generation, capture)
            while self._current(generation):
                if needs_open:
                    if self._stop.wait(delay) or not self._current(generation):
                        break
                    reopened, delay = self._reopen(generation, capture, delay)
                    if not reopened:
                        continue
                    if not self._current(generation):
                        break
                    needs_open = False
                    self._reconnected(capture)
                capture.pace()
                started = time.monotonic()
                try:
                    image = self._timed(generation, capture.read)
                except Exception as exc:
                    if not self.recovers:
                        raise
                    image, needs_open = None, True
                    if self._current(generation):
                        self._fault("error", exc)
                now = time.monotonic()
                if not self._current(generation):
                    break
                if needs_open:
                    continue
                if image is None:
                    if self.recovers:
                        self._fault("lost", "no frame from the source (stream ended or device gone)")
                        needs_open = True
                        continue
                    with self._cond:
                        self._ended = True
                        self._cond.notify_all()
                    return
                if broken_image(image):
                    broken_streak += 1
                    with self._cond:
                        self.broken += 1
                    if self.recovers and broken_streak >= self.max_broken:
                        self._fault("broken", "{} broken images in a row".format(broken_streak))
                        broken_streak, needs_open = 0, True
                    continue
                broken_streak = 0
                delay = self.reconnect_initial_s or 0.0  # healthy again: the next fault starts a fresh backoff
                self._publish(image, now, (now - started) * 1e3)
        except BaseException as exc:  # surfaced to the consumer by get()
            with self._cond:
                self._error = exc
                self._cond.notify_all()
        finally:
            if generation != self._generation:
                capture.close()  # an abandoned reader releases its own capture once its read returns

    def _reopen(self, generation: int, capture: Capture, delay: float) -> Tuple[bool, float]:
        """Close and open `capture` again: (whether it opened, the wait before the next try)."""
        try:
            self._timed(generation, lambda: (capture.close(), capture.open()))
        except Exception as exc:
            delay = min(delay * 2, self.reconnect_max_s)
            self._emit("source_reconnect_failed", source=capture.description,
                       error="{}: {}".format(type(exc).__name__, exc), retry_in_s=delay)
            return False, delay
        return True, delay

    def _timed(self, generation: int, call: Callable[[], Any]) -> Any:
        """`call()` with its start time kept, so that `recover_stall()` sees a read or reopening that hangs."""
        if generation == self._generation:
            self._read_started = time.monotonic()
        try:
            return call()
        finally:
            if generation == self._generation:
                self._read_started = None

    def _reconnected(self, capture: Capture) -> None:
        with self._cond:
            self.reconnects += 1
        self._emit("source_reconnected", source=capture.description, reconnects=self.reconnects)

    def _publish(self, image: np.ndarray, captured: float, capture_ms: float) -> None:
        with self._cond:
            self.produced += 1
            if self._latest is not None and self._latest.seq > self._delivered_seq:
                self.skipped += 1  # overwritten before the pipeline took it
            self._latest = Frame(image, self.produced, captured, capture_ms)
            self._cond.notify_all()

    def stalled_for(self) -> float:
        """Seconds the read (or reopening) in progress has been blocked (0 when none is)."""
        started = self._read_started
        return time.monotonic() - started if started is not None else 0.0

    def recover_stall(self) -> bool:
        """Abandon a read or reopening blocked for longer than `timeout_s` and read from a fresh capture (live
        sources with `reopen` only). The hung thread exits and closes its capture when its call returns."""
        if not self.recovers or self.reopen is None or self._stop.is_set() or self.stalled_for() < self.timeout_s:
            return False
        stalled = self.stalled_for()
        with self._cond:
            self._generation += 1
            generation = self._generation
        self._fault("hung", "read blocked for {:.1f} s".format(stalled))
        self._read_started = None
        self.capture = self.reopen()
        self._start_thread(generation, self.capture, True)
        return True

    def get(self, timeout_s: Optional[float] = None) -> Frame:
        """Newest unseen frame; raises SourceEnded, SourceTimeout or the capture's own error."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                if self._latest is not None and self._latest.seq > self._delivered_seq:
                    self._delivered_seq = self._latest.seq
                    return self._latest
                if self._error is not None:
                    raise self._error
                if self._ended:
                    raise SourceEnded(self.capture.description)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SourceTimeout("{}: no frame for {:.1f} s".format(self.capture.description, wait_s))
                self._cond.wait(remaining)

    def next_frame(self, wait_s: float) -> Optional[Frame]:
        """The newest unseen frame within `wait_s`, else None: the caller serves its signals, then asks again.

        The quiet-source policy lives here: each `timeout_s` without a frame is a `source_timeout` event (and a
        read hung that long is abandoned for a fresh capture), no first frame within FIRST_FRAME_TIMEOUT_S (or
        `timeout_s` if longer) is an EdgeError naming the last fault, and the frame that ends an outage logs
        `source_recovered`. Raises SourceEnded at the end of a file or folder."""
        try:
            frame = self.get(wait_s)
        except SourceTimeout:
            self._quiet(time.monotonic())
            return None
        now = time.monotonic()
        if self._down_since is not None:
            self._emit("source_recovered", source=self.capture.description,
                       down_s=round(now - self._down_since, 2), **self.stats())
            self._down_since = None
        self._seen_frame, self._last_frame_at = True, now
        return frame

    def _quiet(self, now: float) -> None:
        quiet_s = now - self._last_frame_at
        first_deadline = max(FIRST_FRAME_TIMEOUT_S, self.timeout_s)
        if not self._seen_frame and now - self._started_at >= first_deadline:
            raise EdgeError("{}: no frame within {:.0f} s of start{}".format(
                self.capture.description, first_deadline,
                " (last fault: {})".format(self.last_fault) if self.last_fault else ""))
        if quiet_s < self.timeout_s:
            return
        if self._down_since is None:
            self._down_since = self._last_frame_at
        self._last_frame_at = now  # the next timeout is `timeout_s` from this one
        self.timeouts += 1
        restarted = self.recover_stall()
        if self.timeouts <= 3 or restarted or now - self._last_timeout_log >= 30.0:  # then every 30 s
            self._last_timeout_log = now
            self._emit("source_timeout", source=self.capture.description, down_s=round(now - self._down_since, 1),
                       hung_read_restarted=restarted, **self.stats())

    def stats(self) -> Dict[str, int]:
        with self._cond:
            return {"produced": self.produced, "skipped": self.skipped, "broken": self.broken,
                    "faults": self.faults, "reconnects": self.reconnects, "source_timeouts": self.timeouts}

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=1.0)
        if thread is None or not thread.is_alive():
            self.capture.close()
        # else: a read is hung in a driver; closing under it could crash, the daemon thread dies with the process
