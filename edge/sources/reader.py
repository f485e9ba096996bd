"""The frame reader (Frigate's CameraCapture): one Capture read in its own thread into a single slot, so no queue
builds up (the pipeline always gets the newest frame; frames it never saw are counted as skipped), reopened with
exponential backoff after a fault. The policy around it (a quiet source, a read hung in a driver, a source that
never gave a frame) is the supervisor's, edge/sources/source.py.
"""

import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from edge.errors import EdgeError
from edge.infer.pipeline import Frame
from edge.sources.capture import Capture, SourceEnded, SourceTimeout, broken_image


class FrameReader:
    """Reads a Capture in a thread; `get()` returns the newest frame the caller has not seen yet.

    With `reconnect_initial_s` set and a live capture, read errors, a lost stream (read() -> None) and
    `max_broken` broken images in a row are faults: the capture is closed and reopened with exponential
    backoff (`reconnect_initial_s` doubling up to `reconnect_max_s`), `faults` and `reconnects` count them and
    `on_event(name, fields)` reports them. Without it (files, tests) an error is raised to the consumer and None
    ends the source.

    `staging` (set by the GPU stages: CudaPreprocessor.staging_buffers) gives buffers for a frame size: each read
    goes into one that holds neither the newest frame nor the one the consumer took last (released by its next
    get()), so a read never overwrites a frame the pipeline is copying to the GPU.
    """

    def __init__(self, capture: Capture, timeout_s: float = 2.0, reconnect_initial_s: Optional[float] = None,
                 reconnect_max_s: float = 30.0, on_event: Optional[Callable[[str, Dict[str, Any]], None]] = None,
                 max_broken: int = 5):
        self.capture = capture
        self.timeout_s = timeout_s
        self.reconnect_initial_s = reconnect_initial_s
        self.reconnect_max_s = max(reconnect_max_s, reconnect_initial_s or 0.0)
        self.on_event = on_event
        self.max_broken = max_broken
        self._cond = threading.Condition()
        self._latest: Optional[Frame] = None
        self._delivered_seq = 0
        self._ended = False
        self._error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._abandoned = False  # replaced while hung: the thread closes its capture once the call returns
        self._thread: Optional[threading.Thread] = None
        self._read_started: Optional[float] = None
        self.opening = False  # the call in progress is an open (a camera may take seconds), not a read
        self.produced = 0
        self.skipped = 0
        self.broken = 0  # images rejected as broken (never handed to the pipeline)
        self.faults = 0  # live-source failures: read errors, lost stream, broken streaks, hung reads
        self.reconnects = 0  # successful reopenings after a fault
        self.last_fault: Optional[str] = None  # the latest fault's error
        self.staging: Optional[Callable[[int, int], Sequence[np.ndarray]]] = None
        self._held: Optional[Frame] = None  # the frame get() handed out last
        self._shape: Optional[Tuple[int, ...]] = None  # of the last frame read

    @property
    def recovers(self) -> bool:
        return self.reconnect_initial_s is not None and bool(getattr(self.capture, "live", False))

    def successor(self, capture: Capture) -> "FrameReader":
        """A reader of `capture` with this one's settings that counts (and numbers frames) on from this one's
        counters: it takes over when this one's read hangs."""
        fresh = FrameReader(capture, self.timeout_s, self.reconnect_initial_s, self.reconnect_max_s, self.on_event,
                            self.max_broken)
        with self._cond:
            fresh.produced, fresh.skipped, fresh.broken = self.produced, self.skipped, self.broken
            fresh.faults, fresh.reconnects, fresh.last_fault = self.faults, self.reconnects, self.last_fault
        fresh.staging = self.staging
        return fresh

    def start(self, reconnect: bool = False) -> "FrameReader":
        """Open the capture and read it in a thread. A live capture is opened by the thread (an open that hangs in a
        driver is a stall `stalled_for()` shows), files and folders here (a bad one is an error now). `reconnect`:
        the capture takes over from a hung one, so it is opened after the backoff delay, as a reconnect."""
        if reconnect:
            needs_open: Optional[bool] = True
        elif self.recovers:
            needs_open = None
        else:
            self.capture.open()
            needs_open = False
        self._thread = threading.Thread(target=self._run, args=(needs_open,), name="edge-reader", daemon=True)
        self._thread.start()
        return self

    def _open_first(self) -> bool:
        """The first open of a live capture; a camera that is not there yet is a fault, retried with backoff."""
        try:
            self._timed(self.capture.open, opening=True)
            return True
        except Exception as exc:
            self._fault("open", exc)
            return False

    def emit(self, event: str, **fields: Any) -> None:
        """`on_event(event, fields)`; reporting must never take the reader (or the frame loop) down."""
        if self.on_event is not None:
            try:
                self.on_event(event, fields)
            except Exception:
                pass

    def _fault(self, kind: str, detail: Any) -> None:
        error = detail if isinstance(detail, str) else str(detail) if isinstance(detail, EdgeError) else \
            "{}: {}".format(type(detail).__name__, detail)
        with self._cond:
            self.faults += 1
            self.last_fault = error
        self.emit("source_fault", source=self.capture.description, fault=kind, error=error, faults=self.faults)

    def _running(self) -> bool:
        return not self._stop.is_set()

    def _run(self, needs_open: Optional[bool]) -> None:
        """Read until stopped. `needs_open`: None for the first open of a live capture, True to reopen one."""
        capture = self.capture
        delay = self.reconnect_initial_s or 0.0
        broken_streak = 0
        try:
            if needs_open is None:
                needs_open = not self._open_first()
            while self._running():
                if needs_open:
                    if self._stop.wait(delay):
                        break
                    reopened, delay = self._reopen(delay)
                    if not reopened or not self._running():  # retried after `delay`, or stopped
                        continue
                    needs_open = False
                    self._reconnected()
                capture.pace()
                started = time.monotonic()
                try:
                    image = self._timed(self._read)
                except Exception as exc:
                    if not self.recovers:
                        raise
                    image, needs_open = None, True
                    if self._running():
                        self._fault("error", exc)
                now = time.monotonic()
                if not self._running():
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
            if self._abandoned:
                capture.close()  # an abandoned reader releases its own capture once its read returns

    def _read(self) -> Optional[np.ndarray]:
        """capture.read(), into a free staging buffer where there is one for the last frame's size."""
        staging, shape = self.staging, self._shape
        if staging is None or shape is None or len(shape) != 3:
            image = self.capture.read()
        else:
            with self._cond:
                busy = {f.image.__array_interface__["data"][0] for f in (self._latest, self._held) if f is not None}
            try:
                pool = staging(shape[0], shape[1])
            except EdgeError:  # its preprocessor was closed (a reload): the capture's own arrays until told anew
                pool = ()
            free = [b for b in pool if b.ctypes.data not in busy]
            image = self.capture.read(into=free[0]) if free else self.capture.read()
        if image is not None:
            self._shape = image.shape
        return image

    def _reopen(self, delay: float) -> Tuple[bool, float]:
        """Close and open the capture again: (whether it opened, the wait before the next try)."""
        capture = self.capture
        try:
            self._timed(lambda: (capture.close(), capture.open()), opening=True)
        except Exception as exc:
            delay = min(delay * 2, self.reconnect_max_s)
            self.emit("source_reconnect_failed", source=capture.description,
                      error="{}: {}".format(type(exc).__name__, exc), retry_in_s=delay)
            return False, delay
        return True, delay

    def _timed(self, call: Callable[[], Any], opening: bool = False) -> Any:
        """`call()` with its start time kept, so that `stalled_for()` sees a read or reopening that hangs."""
        self.opening = opening
        self._read_started = time.monotonic()
        try:
            return call()
        finally:
            self._read_started = None

    def _reconnected(self) -> None:
        with self._cond:
            self.reconnects += 1
        self.emit("source_reconnected", source=self.capture.description, reconnects=self.reconnects)

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

    def abandon(self) -> None:
        """Give up on a read (or reopening) that hangs: a `hung` fault, and the thread exits and closes its capture
        when the call returns (closing it under the call could crash the driver)."""
        stalled = self.stalled_for()
        with self._cond:
            self._abandoned = True
        self._stop.set()
        self._fault("hung", "read blocked for {:.1f} s".format(stalled))

    def get(self, timeout_s: Optional[float] = None) -> Frame:
        """Newest unseen frame; raises SourceEnded, SourceTimeout or the capture's own error."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                if self._latest is not None and self._latest.seq > self._delivered_seq:
                    self._delivered_seq = self._latest.seq
                    self._held = self._latest
                    return self._latest
                if self._error is not None:
                    raise self._error
                if self._ended:
                    raise SourceEnded(self.capture.description)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SourceTimeout("{}: no frame for {:.1f} s".format(self.capture.description, wait_s))
                self._cond.wait(remaining)

    def stats(self) -> Dict[str, int]:
        with self._cond:
            return {"produced": self.produced, "skipped": self.skipped, "broken": self.broken,
                    "faults": self.faults, "reconnects": self.reconnects}

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
