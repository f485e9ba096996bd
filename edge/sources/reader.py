"""The frame reader (Frigate's CameraCapture): one Capture read in its own thread, every good frame published
straight into its camera's slot in the batcher (`publish`: edge/sources/cameras.py), where the newest frame wins.
It reads, publishes and reports faults, nothing else: when a live capture fails (a read raises, the stream is lost,
MAX_BROKEN broken images in a row, an open fails) the reader stops and says so in its view; whether and when a
new reader opens the capture again is edge/sources/watch.py's policy, carried out by the watcher. A file or
folder ends the reader at its end, and its error is the run's. Counters go to the camera's SourceStats, which
outlive every reader.
"""

import threading
import time
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple

import numpy as np

from edge.errors import EdgeError
from edge.infer.pipeline import Frame
from edge.sources.capture import Capture, broken_image
from edge.sources.watch import ReaderView, SourceStats

Staging = Callable[[int, int], Sequence[np.ndarray]]
MAX_BROKEN = 5  # broken images in a row that fault a live capture


class FrameReader:
    """Reads `capture` in a thread into `publish(frame)`. `staging` (the GPU stages' page-locked buffers for a frame
    size: CudaPreprocessor.staging_buffers) gives buffers to read into: never one that holds a frame in `busy()`
    (the camera's slot, the batch being served), so a read never overwrites a frame the pipeline is copying."""

    def __init__(self, capture: Capture, *, stats: SourceStats, lock: Any, publish: Callable[[Frame], None],
                 on_event: Callable[[str, Dict[str, Any]], None], changed: Callable[[], None] = lambda: None,
                 staging: Optional[Staging] = None, busy: Callable[[], Iterable[Frame]] = tuple):
        self.capture, self.stats, self.publish, self.on_event = capture, stats, publish, on_event
        self.changed = changed  # told when the reader stops (a fault, the end, an error) and at its first frame
        self.live, self.staging, self.busy = bool(capture.live), staging, busy
        self.lock = lock  # guards `stats`, which the camera's other readers, its watcher and the frame loop share
        self.failed_at: Optional[float] = None  # stopped on a fault then (live sources)
        self.ended = False  # a file or folder came to its end
        self.error: Optional[BaseException] = None  # a file or folder failed: the run's error
        self._busy_since: Optional[float] = None
        self._opening = False
        self._stop = threading.Event()
        self._abandoned = False  # given up while hung: the thread closes its capture once the call returns
        self._thread: Optional[threading.Thread] = None
        self._shape: Optional[Tuple[int, ...]] = None  # of the last frame read

    def view(self) -> ReaderView:
        return ReaderView(live=self.live, failed_at=self.failed_at, busy_since=self._busy_since,
                          opening=self._opening, last_frame=self.stats.last_frame, last_fault=self.stats.last_fault)

    def start(self, reopen: bool = False) -> "FrameReader":
        """Read in a thread. A live capture is opened by the thread (an open that hangs in a driver is a stall the
        watcher sees), a file or folder here (a bad one is an error now); `reopen`: after a fault (a success counts
        as a reconnect)."""
        if not self.live:
            self.capture.open()
        self._thread = threading.Thread(target=self._run, args=(reopen,), daemon=True,
                                        name="edge-reader-" + self.capture.description[:20])
        self._thread.start()
        return self

    def _run(self, reopen: bool) -> None:
        try:
            if self.live and not self._open(reopen):
                return
            self._read_until_stopped()
        except BaseException as exc:  # a file or folder that failed (live sources fault instead)
            self.error = exc
            self.changed()
        finally:
            if self._abandoned:
                self.capture.close()  # closing under a hung call could crash the driver: closed once it returns

    def _open(self, reopen: bool) -> bool:
        capture = self.capture
        try:
            self._timed((lambda: (capture.close(), capture.open())) if reopen else capture.open, opening=True)
        except Exception as exc:  # the first open is a fault; a failed reopen the watcher reports (and retries)
            self._fault("open", exc, counted=not reopen)
            return False
        if reopen:
            with self.lock:
                self.stats.reconnects += 1
                reconnects = self.stats.reconnects
            self.on_event("source_reconnected", {"source": capture.description, "reconnects": reconnects})
        return True

    def _read_until_stopped(self) -> None:
        broken_streak, first = 0, True
        while not self._stop.is_set():
            self.capture.pace()
            started = time.monotonic()
            try:
                image = self._timed(self._read)
            except Exception as exc:
                if not self.live:
                    raise
                return self._fault("error", exc)
            now = time.monotonic()
            if self._stop.is_set():
                return
            if image is None:
                if self.live:
                    return self._fault("lost", "no frame from the source (stream ended or device gone)")
                self.ended = True
                return self.changed()
            if broken_image(image):
                broken_streak += 1
                with self.lock:
                    self.stats.broken += 1
                if self.live and broken_streak >= MAX_BROKEN:
                    return self._fault("broken", "{} broken images in a row".format(broken_streak))
                continue
            broken_streak = 0
            with self.lock:
                self.stats.produced += 1
                seq, self.stats.last_frame = self.stats.produced, now
            self.publish(Frame(image, seq, now, (now - started) * 1e3))
            if first:  # the watcher sees a recovery at once
                first = False
                self.changed()

    def _read(self) -> Optional[np.ndarray]:
        """capture.read(), into a free staging buffer where there is one for the last frame's size."""
        staging, shape = self.staging, self._shape
        if staging is None or shape is None or len(shape) != 3:
            image = self.capture.read()
        else:
            busy = {f.image.__array_interface__["data"][0] for f in self.busy()}
            try:
                pool = staging(shape[0], shape[1])
            except EdgeError:  # its preprocessor was closed (a reload): the capture's own arrays until told anew
                pool = ()
            free = [b for b in pool if b.ctypes.data not in busy]
            image = self.capture.read(into=free[0]) if free else self.capture.read()
        if image is not None:
            self._shape = image.shape
        return image

    def _timed(self, call: Callable[[], Any], opening: bool = False) -> Any:
        """`call()` with its start kept, so that the watcher sees a read or an open that hangs."""
        self._opening, self._busy_since = opening, time.monotonic()
        try:
            return call()
        finally:
            self._busy_since = None

    def _fault(self, kind: str, detail: Any, counted: bool = True) -> None:
        """Stop on a fault of a live capture, counted and reported; the watcher decides what comes next."""
        error = detail if isinstance(detail, str) else str(detail) if isinstance(detail, EdgeError) else \
            "{}: {}".format(type(detail).__name__, detail)
        with self.lock:
            self.stats.faults += counted
            self.stats.last_fault = error
            faults = self.stats.faults
        if counted and not self._stop.is_set():
            self.on_event("source_fault", {"source": self.capture.description, "fault": kind, "error": error,
                                           "faults": faults})
        self.failed_at = time.monotonic()
        self.changed()

    def abandon(self) -> None:
        """Give up on a call that hangs: a `hung` fault; the thread closes its capture when the call returns."""
        started = self._busy_since
        self._abandoned = True
        self._fault("hung", "read blocked for {:.1f} s".format(time.monotonic() - started if started else 0.0))
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=1.0)
        if thread is None or not thread.is_alive():
            self.capture.close()
        else:  # a read hung in a driver: closing under it could crash; the thread closes it when it returns
            self._abandoned = True
