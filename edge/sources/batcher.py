"""The deadline batcher: which waiting frames one engine serves next, and when. Policy only: no clock, no thread,
no I/O. The caller (edge/sources/cameras.py, and the unit tests with a fake clock) passes `now` in seconds.

The rules (docs/throughput.md), for N cameras on one engine:
- One slot per camera: the newest frame wins; the frame it replaces is `superseded`. So a batch holds at most one
  frame per camera, and nothing queues up behind a slow engine.
- A frame's deadline is its capture time + the budget. A frame that cannot make it even alone at the typical cost
  (now + p50 L(1) + margin > deadline) is dropped as `expired`: served late, it would be a miss and delay others.
- Overload: when no waiting frame could make its deadline even served the moment it arrived (arrival + p50 L(1) +
  margin > deadline: a slow board, throttling, a heavy model, costs not measured yet), nothing is dropped: the
  cameras are served best effort in turn, each batch the size that serves most frames per second, each late result
  a miss, and `overloaded` says why. What is served is measured, so the overload ends with the slow spell.
- Earliest deadline first, ties round-robin across cameras. The batch is the largest n <= the current limit whose
  service time L(n), the p99 of the last batches of that size, still meets the earliest deadline.
- Short of a full batch (every live camera, or the limit), it waits for the next expected frame (each camera's
  period and last capture) only while that still fits: the wait ends by `max_wait` after the oldest waiting frame
  arrived and early enough for L(n+1) to meet the earliest deadline. A camera overdue by half a period counts as
  stalled: no one waits for it.
- A miss (a served frame late) cuts the limit to floor(0.9 x limit) (at least 1); RECOVER_AFTER clean batches in a
  row add one back, up to `max_batch` (Clipper's AIMD).
"""

import collections
import math
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

WINDOW = 64  # the last batches (of any size) whose service times give each size's p99
RECOVER_AFTER = 16  # clean batches in a row before the limit grows by one
STALL_PERIODS = 1.5  # a camera whose frame is this many periods late is stalled: nobody waits for it


@dataclass
class Pending:
    """A frame waiting for the engine; `item` is the caller's (the Frame), never looked at here."""

    camera: int
    captured: float
    deadline: float
    arrived: float
    item: Any = None


@dataclass
class Decision:
    serve: List[Pending] = field(default_factory=list)  # run these now, as one batch, in this order
    expired: List[Pending] = field(default_factory=list)  # dropped: they cannot make their deadline
    wake_at: Optional[float] = None  # nothing to serve: decide again then, or when a frame arrives


class CostModel:
    """L(n): the p99 service time (seconds) of the batches of n frames among the last WINDOW batches of any size, so
    a size not served for a while is priced afresh (a slow spell is forgotten). A size without a recent batch is
    priced from the nearest recent size, scaled by the ratio of the two measured at start (`seed`: what batching
    buys on this engine), or linearly where the start measured neither (batching never assumed to help)."""

    def __init__(self, seed: Optional[Dict[int, float]] = None):
        self.batches = 0
        self.samples: Dict[int, Deque[Tuple[int, float]]] = {}
        self.seed = {n: s for n, s in (seed or {}).items() if s > 0}
        self._priced: Dict[Tuple[int, float], float] = {}  # estimate(n, q) since the last observe
        for n, seconds in self.seed.items():
            self.observe(n, seconds)

    def observe(self, n: int, seconds: float) -> None:
        self.batches += 1
        self.samples.setdefault(n, collections.deque()).append((self.batches, seconds))
        self._priced.clear()

    def _quantile(self, n: int, q: float) -> Optional[float]:
        window = self.samples.get(n)
        while window and window[0][0] <= self.batches - WINDOW:
            window.popleft()
        if not window:
            return None
        ordered = sorted(s for _, s in window)
        return ordered[max(0, min(len(ordered) - 1, int(math.ceil(q * len(ordered))) - 1))]

    def estimate(self, n: int, q: float = 0.99) -> float:
        """The q-quantile (default the p99) of recent batches of n; priced once per observation."""
        priced = self._priced.get((n, q))
        if priced is None:
            priced = self._priced[(n, q)] = self._estimate(n, q)
        return priced

    def _estimate(self, n: int, q: float) -> float:
        own = self._quantile(n, q)
        if own is not None:
            return own
        recent = {k: v for k, v in ((k, self._quantile(k, q)) for k in list(self.samples)) if v is not None}
        if not recent:
            return 0.0
        smaller = [k for k in recent if k < n]
        k = max(smaller) if smaller else min(recent)
        if n in self.seed and k in self.seed:
            return recent[k] * self.seed[n] / self.seed[k]
        return recent[k] * n / k if smaller else recent[k]


class DeadlineBatcher:
    """Frames in (`offer`), decisions out (`decide`), outcomes back (`finished`). `periods`: each camera's frame
    interval in seconds (1 / its fps); `budget`, `max_wait` and `margin` in seconds."""

    def __init__(self, periods: Sequence[float], *, budget: float, max_batch: int, max_wait: float, margin: float,
                 cost: Optional[CostModel] = None):
        self.periods = list(periods)
        self.budget, self.max_batch, self.max_wait, self.margin = budget, max_batch, max_wait, margin
        self.cost = cost or CostModel()
        self.limit = max_batch  # the AIMD batch limit now
        self.slots: List[Optional[Pending]] = [None] * len(self.periods)
        self.last_capture: List[Optional[float]] = [None] * len(self.periods)
        self.clean = 0  # clean batches in a row
        self.rr = 0  # the camera that wins the next tie
        self.overloaded: Optional[str] = None  # why every camera is served best effort now, or None

    @property
    def cameras(self) -> int:
        return len(self.periods)

    def offer(self, camera: int, captured: float, now: float, item: Any = None) -> Optional[Pending]:
        """A camera's new frame; returns the frame of that camera it replaces (superseded), if one was waiting."""
        old = self.slots[camera]
        self.slots[camera] = Pending(camera, captured, captured + self.budget, now, item)
        self.last_capture[camera] = captured
        return old

    def pending(self) -> List[Pending]:
        return [p for p in self.slots if p is not None]

    def live(self, now: float) -> List[int]:
        """Cameras that gave a frame and are not overdue by STALL_PERIODS periods."""
        return [c for c, last in enumerate(self.last_capture)
                if last is not None and now <= last + STALL_PERIODS * self.periods[c]]

    def _key(self, p: Pending) -> Any:
        return p.deadline, (p.camera - self.rr) % self.cameras

    def decide(self, now: float) -> Decision:
        decision = Decision()
        alone = self.cost.estimate(1, 0.5) + self.margin
        self._overload(alone)
        if not self.overloaded:
            self._expire(now, alone, decision)
        waiting = sorted(self.pending(), key=self._key)
        if not waiting:
            return decision
        if self.overloaded:  # round robin: every camera in turn, whatever its deadline
            waiting.sort(key=lambda p: (p.camera - self.rr) % self.cameras)
            n = self._most_per_second(len(waiting))
        else:
            n = self._largest_in_time(now, waiting)
            full = n >= self.limit or n >= max(len(self.live(now)), len(waiting))
            wake = None if full or n < len(waiting) else self._wait_until(now, waiting, waiting[0].deadline)
            if wake is not None:
                decision.wake_at = wake
                return decision
        decision.serve = waiting[:n]
        for p in decision.serve:
            self.slots[p.camera] = None
        self.rr = (decision.serve[-1].camera + 1) % self.cameras
        return decision

    def _overload(self, alone: float) -> None:
        """Overloaded while every waiting frame was already hopeless when it arrived (the state holds while
        nothing waits)."""
        waiting = self.pending()
        if waiting:
            self.overloaded = None if any(p.arrived + alone <= p.deadline for p in waiting) else \
                "overloaded: one frame alone takes {:.1f} ms (p50, with the margin), over the {:g} ms budget; " \
                "every camera served best effort, each late result a miss".format(alone * 1e3, self.budget * 1e3)

    def _largest_in_time(self, now: float, waiting: List[Pending]) -> int:
        """The largest batch (at least 1) within the limit whose p99 cost still meets the earliest deadline."""
        for size in range(min(self.limit, len(waiting)), 1, -1):
            if now + self.cost.estimate(size) + self.margin <= waiting[0].deadline:
                return size
        return 1

    def _most_per_second(self, waiting: int) -> int:
        """Under overload: the largest batch (of those waiting, up to max_batch) within 1 % of the most frames a
        second."""
        rate = {n: n / max(self.cost.estimate(n, 0.5), 1e-9) for n in range(1, min(self.max_batch, waiting) + 1)}
        return max(n for n in rate if rate[n] >= 0.99 * max(rate.values()))

    def _expire(self, now: float, alone: float, decision: Decision) -> None:
        """Drop what cannot make its deadline even alone at the typical (p50) cost (`alone`, with the margin)."""
        hopeless = [p for p in self.pending() if now + alone > p.deadline]
        for p in hopeless:
            decision.expired.append(p)
            self.slots[p.camera] = None

    def _wait_until(self, now: float, waiting: List[Pending], earliest: float) -> Optional[float]:
        """The latest time to go with one more frame, if a live camera's next frame is expected before it."""
        latest = min(earliest - self.cost.estimate(len(waiting) + 1) - self.margin,
                     min(p.arrived for p in waiting) + self.max_wait)
        if latest <= now:
            return None
        have = {p.camera for p in waiting}
        expected = [self.last_capture[c] + self.periods[c] for c in self.live(now) if c not in have]  # type: ignore
        return latest if expected and min(expected) <= latest else None

    def finished(self, n: int, service: float, missed: bool) -> None:
        """A batch of `n` took `service` seconds; `missed`: one of its frames was late. Prices one frame alone now,
        which every decision asks first, so that the next frame's decision does not sort the window."""
        self.cost.observe(n, service)
        self.cost.estimate(1, 0.5)
        if missed:
            self.limit, self.clean = max(1, int(math.floor(0.9 * self.limit))), 0
            return
        self.clean += 1
        if self.clean >= RECOVER_AFTER and self.limit < self.max_batch:
            self.limit, self.clean = self.limit + 1, 0
