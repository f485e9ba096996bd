"""systemd integration (Type=notify): READY=1, WATCHDOG=1, STATUS=, RELOADING=1, STOPPING=1.

Messages go through the `sdnotify` library to $NOTIFY_SOCKET (a path, or `@name` for an abstract socket,
which sdnotify maps to a leading NUL). sdnotify swallows errors unless `debug=True`: we pass it and count
and log failures ourselves instead of losing them. Without NOTIFY_SOCKET (not under systemd) every call is
a no-op.

Watchdog: systemd exports WATCHDOG_USEC (WatchdogSec=) and, for forking setups, WATCHDOG_PID. We ping
after completed frames at most every WATCHDOG_USEC/2, so a hung inference (a TensorRT call that never
returns) stops the pings and systemd kills and restarts the service. While the source is down the loop
still pings: it is alive and reconnecting, and restarting the process would not bring a camera back. A SIGHUP
reload loads the new model beside the serving one (edge/service/reload.py): frames, and so the pings, go on.
"""

import math
import os
import threading
import time
from typing import Any, Callable, Optional

from edge.errors import require
from edge.infer.latency import LatencyRecorder
from edge.infer.pipeline import Result, Sink


class Notifier:
    def __init__(self, log: Optional[Callable[..., None]] = None):
        self.log = log
        self.socket_path = os.environ.get("NOTIFY_SOCKET") or None
        self.watchdog_interval_s: Optional[float] = None
        usec, pid = os.environ.get("WATCHDOG_USEC", ""), os.environ.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval_s = int(usec) / 1e6 / 2.0
        self.sent = 0
        self.errors = 0
        self.ready_sent = False
        self.last_watchdog = -math.inf
        self._lock = threading.Lock()
        self._sd: Any = None
        if self.socket_path:
            sdnotify = require("sdnotify")
            try:
                self._sd = sdnotify.SystemdNotifier(debug=True)  # debug: raise instead of silently dropping
            except Exception as exc:
                self._failed("connect", exc)

    @property
    def enabled(self) -> bool:
        return self._sd is not None

    def _failed(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        if self.log is not None and (self.errors <= 3 or self.errors % 100 == 0):
            self.log("notify_error", level="warning", action=what, socket=self.socket_path,
                     error="{}: {}".format(type(exc).__name__, exc), errors=self.errors)

    def send(self, message: str) -> bool:
        """Send one datagram (several `KEY=value` lines allowed); False when not under systemd or on error."""
        if self._sd is None:
            return False
        with self._lock:
            try:
                self._sd.notify(message)
            except Exception as exc:
                self._failed("send", exc)
                return False
            self.sent += 1
            return True

    def ready(self, status: str = "") -> bool:
        """READY=1, with WATCHDOG=1 in the same datagram when the watchdog is on: systemd counts only WATCHDOG=1
        as a ping, and the next ping is paced from this one (a READY=1 alone after a reload left the watchdog
        running from the ping before it, and reloads in a row outlasted WatchdogSec)."""
        message = "READY=1" + ("\nWATCHDOG=1" if self.watchdog_interval_s is not None else "") + \
            ("\nSTATUS=" + _one_line(status) if status else "")
        ok = self.send(message)
        self.ready_sent = True
        if ok and self.watchdog_interval_s is not None:
            self.last_watchdog = time.monotonic()
        return ok

    def watchdog(self, now: Optional[float] = None) -> bool:
        """Ping if WatchdogSec is set, READY was sent, and half the interval has passed since the last ping."""
        if self.watchdog_interval_s is None or not self.ready_sent:
            return False
        now = time.monotonic() if now is None else now
        if now - self.last_watchdog < self.watchdog_interval_s:
            return False
        self.last_watchdog = now
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.send("STATUS=" + _one_line(text))

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets systemd >= 253 match the reload to our RELOADING=1 (Type=notify-reload)
        return self.send("RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading".format(
            int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)))

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1\nSTATUS=" + _one_line(status))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class NotifySink(Sink):
    """READY=1 with the first delivered (timed) frame, WATCHDOG=1 after completed frames, STATUS every few s."""

    def __init__(self, notifier: Notifier, recorder: LatencyRecorder, status_every_s: float = 5.0,
                 degraded: Callable[[], Optional[str]] = lambda: None):
        self.notifier = notifier
        self.degraded = degraded  # why the service runs degraded now (the stages say), or None
        self.recorder = recorder  # for the p99 (the counters come with each Result)
        self.status_every_s = status_every_s
        self._last_status = time.monotonic()
        self._frames_at_status = 0

    def status_text(self, result: Result, now: float) -> str:
        elapsed = now - self._last_status
        fps = (result.frames - self._frames_at_status) / elapsed if elapsed > 0 else 0.0
        e2e = self.recorder.stages.get("end_to_end")
        p99 = e2e.summary().get("p99", 0.0) if e2e is not None and e2e.count else 0.0
        rate = result.misses / result.frames if result.frames else 0.0
        text = "fps {:.1f}, p99 {:.1f} ms, misses {} ({:.2%}) of {} frames, errors {}".format(
            fps, p99, result.misses, rate, result.frames, result.errors)
        degraded = self.degraded()
        return "degraded: {}; {}".format(degraded, text) if degraded else text

    def on_result(self, result: Result) -> None:
        if result.status == "error":
            return  # a failing frame is not progress: no ping (too many in a row end the process anyway)
        notifier = self.notifier
        if not notifier.enabled:
            return
        now = time.monotonic()
        if not notifier.ready_sent:
            notifier.ready(self.status_text(result, now))
            self._last_status, self._frames_at_status = now, result.frames
            return
        notifier.watchdog(now)
        if now - self._last_status >= self.status_every_s:
            notifier.status(self.status_text(result, now))
            self._last_status, self._frames_at_status = now, result.frames
