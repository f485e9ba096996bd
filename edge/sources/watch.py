"""Source recovery, decided in one place (Frigate's camera watchdog): policy only, no clock, no thread, no I/O.

A reader (edge/sources/reader.py) only reads, publishes and reports faults; what it is doing is its `ReaderView`.
`Watch.decide(now, view)` says what to do about it, and the watcher thread (edge/sources/source.py) only carries
that out:
- wait     nothing to do until `wake_at` (or the reader changes);
- report   events to log (a quiet source, a source silent since start, a recovery);
- reopen   the reader failed (a read error, a lost stream, a broken streak, an open that failed): a new reader
           opens the capture again after the backoff; `fresh`: the old reader's call hangs in a driver, so it is
           abandoned with its capture and the new reader gets a fresh one;
- give up  no first frame within `start_timeout_s` (only with `give_up_at_start`: under systemd a camera absent
           at boot is waited for, reported once).
Reopen delays are one Backoff (also telemetry's reconnect to jtop); counters live in SourceStats, which outlive
every reader of a camera.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

WAIT, REPORT, REOPEN, GIVE_UP = "wait", "report", "reopen", "give up"
TIMEOUT_LINES = 3  # source_timeout lines logged in a row before one per TIMEOUT_LOG_S
TIMEOUT_LOG_S = 30.0


class Backoff:
    """Exponential backoff: `initial` doubling up to `maximum`; `reset()` after a success."""

    def __init__(self, initial: float, maximum: float):
        self.initial, self.maximum = initial, max(maximum, initial)
        self.delay = initial  # the wait before the next attempt

    def next(self) -> float:
        """The wait before this attempt; the following one waits twice as long (up to `maximum`)."""
        delay = self.delay
        self.delay = min(self.delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.delay = self.initial


@dataclass
class SourceStats:
    """One camera's counters, kept across its readers (a reopen starts a new reader, never a new count)."""

    produced: int = 0  # frames read and published
    skipped: int = 0  # replaced by the camera's newer frame before the engine took them
    expired: int = 0  # dropped: they could no longer make their deadline
    broken: int = 0  # images rejected as broken (never published)
    faults: int = 0  # live-source failures: read errors, lost streams, broken streaks, failed opens, hangs
    reconnects: int = 0  # successful reopenings after a fault
    source_timeouts: int = 0  # `timeout_s` without a frame
    last_fault: Optional[str] = None
    last_frame: Optional[float] = None  # when the latest frame was published, by whichever reader

    def counters(self) -> Dict[str, int]:
        return {"produced": self.produced, "skipped": self.skipped, "expired": self.expired, "broken": self.broken,
                "faults": self.faults, "reconnects": self.reconnects, "source_timeouts": self.source_timeouts}


@dataclass
class ReaderView:
    """What the watcher sees of a camera's reader at `now`."""

    live: bool  # a camera, stream or synthetic source: reopened after a fault (files and folders end or fail)
    failed_at: Optional[float] = None  # the reader stopped on a fault then, and waits to be reopened
    busy_since: Optional[float] = None  # a read or open in progress since then (None between calls)
    opening: bool = False  # the call in progress is an open (a camera may take seconds)
    last_frame: Optional[float] = None  # when the camera's latest frame was published (by any of its readers)
    last_fault: Optional[str] = None


@dataclass
class Verdict:
    action: str = WAIT
    events: List[Tuple[str, Dict[str, Any]]] = field(default_factory=list)  # (event, fields) to log
    fresh: bool = False  # reopen on a fresh capture: the old reader's call hangs
    error: Optional[str] = None  # give up: why
    wake_at: Optional[float] = None  # wait: decide again then at the latest


class Watch:
    """One camera's recovery policy. `timeout_s`: no frame for that long is a `source_timeout`, and a read hung
    that long is abandoned (an open: `start_timeout_s`); `start_timeout_s`: no first frame by then gives up or,
    without `give_up_at_start`, is reported once."""

    def __init__(self, *, started: float, timeout_s: float, start_timeout_s: float, backoff: Backoff,
                 give_up_at_start: bool):
        self.timeout_s, self.start_timeout_s = timeout_s, max(start_timeout_s, timeout_s)
        self.backoff, self.give_up_at_start = backoff, give_up_at_start
        self.started = started
        self.quiet_from = started  # the next timeout is `timeout_s` after this
        self.down_since: Optional[float] = None
        self.timeouts = 0
        self.start_reported = False
        self.retry_at: Optional[float] = None  # a failed reader is reopened then
        self.reopened_at: Optional[float] = None
        self.last_timeout_line = -float("inf")

    def decide(self, now: float, view: ReaderView) -> Verdict:
        verdict = Verdict()
        self._recovered(now, view, verdict)
        if self._no_first_frame(now, view, verdict):
            return verdict
        if view.failed_at is not None and view.live:
            self._after_fault(now, view, verdict)
        hung = verdict.action != REOPEN and self._hung(now, view)
        quiet_end = max(self.quiet_from, view.last_frame or self.quiet_from) + self.timeout_s
        if quiet_end <= now or hung:
            self._timeout(now, view, verdict, hung)
            quiet_end = now + self.timeout_s
        verdict.wake_at = quiet_end if verdict.wake_at is None else min(verdict.wake_at, quiet_end)
        return verdict

    def _recovered(self, now: float, view: ReaderView, verdict: Verdict) -> None:
        """A frame since the last reopen resets the backoff; the one that ends an outage is reported."""
        if view.last_frame is None:
            return
        if self.reopened_at is not None and view.last_frame >= self.reopened_at:
            self.backoff.reset()
            self.reopened_at = None
        if self.down_since is not None and view.last_frame >= self.quiet_from:
            verdict.action = REPORT
            verdict.events.append(("source_recovered", {"down_s": round(view.last_frame - self.down_since, 2)}))
            self.down_since = None

    def _after_fault(self, now: float, view: ReaderView, verdict: Verdict) -> None:
        """A failed reader is reopened after the backoff's delay; a failed reopen is reported."""
        assert view.failed_at is not None
        if self.retry_at is None:
            delay = self.backoff.next()
            self.retry_at = view.failed_at + delay
            if self.reopened_at is not None:  # the reopen itself failed
                verdict.events.append(("source_reconnect_failed", {"error": view.last_fault,
                                                                   "retry_in_s": round(delay, 3)}))
                verdict.action = REPORT
        if now < self.retry_at:
            verdict.wake_at = self.retry_at
            return
        self.retry_at, self.reopened_at = None, now
        verdict.action = REOPEN

    def _hung(self, now: float, view: ReaderView) -> bool:
        limit = self.start_timeout_s if view.opening else self.timeout_s
        return view.live and view.busy_since is not None and now - view.busy_since >= limit

    def _no_first_frame(self, now: float, view: ReaderView, verdict: Verdict) -> bool:
        """No frame yet `start_timeout_s` after start: give up, or (under systemd) say so once and go on."""
        if view.last_frame is not None or self.start_reported or now - self.started < self.start_timeout_s:
            return False
        error = "no frame within {:g} s of start{}".format(
            self.start_timeout_s, " (last fault: {})".format(view.last_fault) if view.last_fault else "")
        if self.give_up_at_start:
            verdict.action, verdict.error = GIVE_UP, error
            return True
        self.start_reported = True
        verdict.action = REPORT
        verdict.events.append(("source_start_timeout", {"error": error, "action": "retrying with backoff"}))
        return False

    def _timeout(self, now: float, view: ReaderView, verdict: Verdict, hung: bool) -> None:
        """`timeout_s` without a frame: a source_timeout (the first few, then one per TIMEOUT_LOG_S), and a read
        hung that long abandoned for a fresh reader on a fresh capture."""
        if self.down_since is None:
            self.down_since = max(self.quiet_from, view.last_frame or self.quiet_from)
        self.quiet_from = now
        self.timeouts += 1
        if hung:
            verdict.action, verdict.fresh = REOPEN, True
            self.reopened_at = now
        if self.timeouts <= TIMEOUT_LINES or hung or now - self.last_timeout_line >= TIMEOUT_LOG_S:
            self.last_timeout_line = now
            if verdict.action == WAIT:
                verdict.action = REPORT
            verdict.events.append(("source_timeout", {"down_s": round(now - self.down_since, 1),
                                                      "hung_read_restarted": hung}))
