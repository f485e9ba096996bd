"""Several cameras on one engine (config `sources`): the owner of the cameras, their figures and the batcher.

    cameras = CameraSet(camera_cfgs, cfg.runtime, capture_factory, reconnect_initial_s=..., reconnect_max_s=...,
                        on_event=log).start(stages)
    batch = cameras.next_frame(wait_s)     # a Batch the deadline batcher chose, or None (nothing due yet)
    results = pipeline.process_batch(batch.frames, batch.names)
    cameras.finished(batch, results)       # per-camera figures, and the batcher learns the batch's cost

For the frame loop a CameraSet is the source (what `Runtime.frames` reads): each camera has its own
SourceSupervisor (its reader thread keeps the newest frame, reconnects, reports a quiet source) and a thread that
hands its frames over, so a camera that dies, hangs or reconnects delays no other. The scheduling is
edge/sources/batcher.py's (policy only); what the engine costs per batch size is measured here, at start (each size
run a few times) and from every batch served.
"""

import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from edge.config import CameraConfig, RuntimeConfig
from edge.errors import EdgeError
from edge.infer.latency import LatencyRecorder
from edge.infer.pipeline import Frame, Result
from edge.sources.batcher import CostModel, DeadlineBatcher
from edge.sources.capture import Capture, SourceEnded
from edge.sources.source import SourceSupervisor

HANDOVER_S = 0.25  # a camera's thread looks at its stop flag at least this often
SEED_RUNS = 5  # timed runs of each batch size at start (after one untimed), whose median seeds its cost


@dataclass
class Batch:
    """Frames the batcher chose to serve together, at most one per camera."""

    frames: List[Frame]
    names: List[str]
    cameras: List["Camera"]


class Camera:
    """One camera: its source supervisor, the thread that hands its frames over, and its own figures."""

    def __init__(self, index: int, cfg: CameraConfig, supervisor: SourceSupervisor, budget_ms: float, window: int):
        self.index, self.cfg, self.name = index, cfg, cfg.name
        self.supervisor = supervisor
        self.recorder = LatencyRecorder(budget_ms, window)
        self.superseded = 0  # replaced by the same camera's newer frame before the engine took it
        self.expired = 0  # dropped: it could no longer make its deadline
        self.errors = 0
        self.ended = False
        self.thread: Optional[threading.Thread] = None

    def figures(self) -> Dict[str, Any]:
        out: Dict[str, Any] = self.recorder.summary()
        out.update(self.supervisor.stats(), superseded=self.superseded, expired=self.expired, errors=self.errors,
                   source=self.supervisor.capture.description)
        return out


class CameraSet:
    """The cameras of one run, their hand-over slots and the deadline batcher that serves them."""

    def __init__(self, cameras: Sequence[CameraConfig], runtime: RuntimeConfig,
                 capture_factory: Callable[[Any], Capture], *, reconnect_initial_s: float, reconnect_max_s: float,
                 on_event: Callable[[str, Dict[str, Any]], None], give_up_at_start: bool = True):
        self.cfgs = list(cameras)
        self.give_up_at_start = give_up_at_start  # False under systemd: a camera not there yet at boot is waited for
        self.runtime = runtime
        self.capture_factory = capture_factory
        self.reconnect = (reconnect_initial_s, reconnect_max_s)
        self.on_event = on_event
        self.cameras: List[Camera] = []
        self.batcher: Optional[DeadlineBatcher] = None
        self.batch_sizes: Dict[int, int] = {}  # frames per batch -> batches served
        self._cond = threading.Condition()
        self._arrivals: List[Any] = []  # (camera, frame, handed over at)
        self._error: Optional[BaseException] = None
        self._stop = threading.Event()

    @property
    def description(self) -> str:
        return "{} cameras: {}".format(len(self.cameras), ", ".join(
            "{} ({})".format(c.name, c.supervisor.capture.description) for c in self.cameras))

    def start(self, stages: Any) -> "CameraSet":
        """Measure what each batch size costs on `stages`, then open every camera and start handing frames over."""
        batching = self.runtime.batching
        largest = self._largest(stages)
        cost = seed_costs(stages, largest, (self.cfgs[0].height, self.cfgs[0].width))
        self.batcher = DeadlineBatcher([1.0 / c.fps for c in self.cfgs], budget=self.runtime.budget_ms / 1e3,
                                       max_batch=largest, max_wait=batching.max_wait_ms / 1e3,
                                       margin=batching.margin_ms / 1e3, cost=cost)
        for index, cfg in enumerate(self.cfgs):
            self.cameras.append(Camera(index, cfg, self._supervisor(cfg), self.runtime.budget_ms,
                                       self.runtime.latency_window))
        for camera in self.cameras:
            camera.supervisor.start()
            camera.thread = threading.Thread(target=self._hand_over, args=(camera,), daemon=True,
                                             name="edge-camera-" + camera.name)
            camera.thread.start()
        return self

    def _largest(self, stages: Any) -> int:
        batching = self.runtime.batching
        return 1 if batching.policy == "off" else min(batching.max_batch, stages.backend.max_batch, len(self.cfgs))

    def restage(self, stages: Any) -> None:
        """A reload swapped the model: the batch sizes it takes, and their costs measured again."""
        assert self.batcher is not None
        largest = self._largest(stages)
        cost = seed_costs(stages, largest, (self.cfgs[0].height, self.cfgs[0].width))
        with self._cond:
            self.batcher.max_batch = self.batcher.limit = largest
            self.batcher.cost = cost

    def _supervisor(self, cfg: CameraConfig) -> SourceSupervisor:
        def event(name: str, fields: Dict[str, Any]) -> None:
            self.on_event(name, dict(fields, camera=cfg.name))

        return SourceSupervisor(self.capture_factory(cfg), cfg.timeout_s, self.reconnect[0], self.reconnect[1],
                                reopen=lambda: self.capture_factory(cfg), on_event=event,
                                start_timeout_s=cfg.start_timeout_s, give_up_at_start=self.give_up_at_start)

    def _hand_over(self, camera: Camera) -> None:
        """The camera's thread: its newest frames into the hand-over list; its end or failure noted."""
        try:
            while not self._stop.is_set():
                frame = camera.supervisor.next_frame(min(HANDOVER_S, camera.cfg.timeout_s))
                if frame is not None:
                    with self._cond:
                        self._arrivals.append((camera, frame, time.monotonic()))
                        self._cond.notify_all()
        except SourceEnded:
            with self._cond:
                camera.ended = True
                self._cond.notify_all()
        except Exception as exc:  # a dead camera at start (no first frame), a file failing: the run's error
            why = str(exc) if isinstance(exc, EdgeError) else "{}: {}: {}".format(camera.cfg.uri, type(exc).__name__,
                                                                                 exc)
            with self._cond:
                self._error = EdgeError("sources[{}] ({}): {}".format(camera.index, camera.name, why),
                                        getattr(exc, "exit_code", 2))
                self._cond.notify_all()

    def next_frame(self, wait_s: float) -> Optional[Batch]:
        """The next batch the batcher chose within `wait_s`, else None. Raises a camera's start failure, and
        SourceEnded once every camera (files, folders) has ended and nothing waits."""
        batcher = self.batcher
        assert batcher is not None, "start first"
        give_up = time.monotonic() + wait_s
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                for camera, frame, at in self._arrivals:
                    if batcher.offer(camera.index, frame.captured, at, (camera, frame)) is not None:
                        camera.superseded += 1
                del self._arrivals[:]
                now = time.monotonic()
                decision = batcher.decide(now)
                for pending in decision.expired:
                    pending.item[0].expired += 1
                if decision.serve:
                    chosen = [p.item for p in decision.serve]
                    return Batch([f for _, f in chosen], [c.name for c, _ in chosen], [c for c, _ in chosen])
                if all(c.ended for c in self.cameras) and not batcher.pending():
                    raise SourceEnded(self.description)
                wake = give_up if decision.wake_at is None else min(give_up, decision.wake_at)
                if now >= give_up:
                    return None
                self._cond.wait(max(0.0, wake - now))

    def finished(self, batch: Batch, results: Sequence[Result], timed: int) -> None:
        """A served batch (its first `timed` results timed): per-camera figures, its cost and any miss to the
        batcher."""
        assert self.batcher is not None
        service_ms = 0.0
        for i, (camera, result) in enumerate(zip(batch.cameras, results)):
            result.cameras = self
            if result.status == "error":
                camera.errors += 1
                continue
            service_ms = result.stage_ms["end_to_end"] - result.stage_ms["frame_age"]
            if i < timed:
                camera.recorder.record(result.stage_ms)
        self.batch_sizes[len(results)] = self.batch_sizes.get(len(results), 0) + 1
        if service_ms:
            self.batcher.finished(len(results), service_ms / 1e3, any(r.status == "miss" for r in results))

    def stats(self) -> Dict[str, int]:
        """The cameras' source counters, summed (what one camera's SourceSupervisor.stats gives)."""
        total: Dict[str, int] = {}
        for camera in self.cameras:
            for key, value in dict(camera.supervisor.stats(), superseded=camera.superseded,
                                   expired=camera.expired).items():
                total[key] = total.get(key, 0) + value
        return total

    def drops(self) -> Dict[str, Dict[str, int]]:
        """Each camera's frames never served: superseded (the reader's and the batcher's) and expired."""
        return {c.name: {"superseded": c.superseded + c.supervisor.stats()["skipped"], "expired": c.expired}
                for c in self.cameras}

    def facts(self) -> Dict[str, Any]:
        """What the start line adds for several cameras."""
        assert self.batcher is not None
        return {"cameras": [c.name for c in self.cameras], "batching": self.runtime.batching.policy,
                "max_batch": self.batcher.max_batch}

    def figures(self) -> Dict[str, Any]:
        """Per-camera figures and the batches served, for the summary lines and the final report."""
        batcher = self.batcher
        return {"cameras": {c.name: c.figures() for c in self.cameras},
                "batches": {str(n): count for n, count in sorted(self.batch_sizes.items())},
                "batch_limit": batcher.limit if batcher is not None else None,
                "max_batch": batcher.max_batch if batcher is not None else None}

    def stop(self) -> None:
        self._stop.set()
        for camera in self.cameras:
            camera.supervisor.stop()
        for camera in self.cameras:
            if camera.thread is not None:
                camera.thread.join(timeout=HANDOVER_S * 4)


_SEEDS: "weakref.WeakKeyDictionary[Any, Dict[Any, float]]" = weakref.WeakKeyDictionary()


def seed_costs(stages: Any, largest: int, shape: Any) -> CostModel:
    """Each batch size up to `largest` run once untimed (a new size allocates) and SEED_RUNS times timed on black
    frames of `shape` (h, w): the median of each seeds its cost (and the sizes' ratios, which price a size not
    served lately). Measured once per loaded backend and frame size (`edge sweep` starts many runs on one model)."""
    image = np.zeros(tuple(shape) + (3,), np.uint8)
    measured = _SEEDS.setdefault(stages.backend, {})
    seed: Dict[int, float] = {}
    for n in range(1, largest + 1):
        if (n, image.shape) in measured:
            seed[n] = measured[(n, image.shape)]
            continue
        stages.classify_batch([image] * n, {})
        runs = []
        for _ in range(SEED_RUNS):
            started = time.monotonic()
            stages.classify_batch([image] * n, {})
            runs.append(time.monotonic() - started)
        seed[n] = measured[(n, image.shape)] = float(np.median(runs))
    return CostModel(seed)


def format_cameras(report: Dict[str, Any]) -> str:
    """The per-camera rows under the latency table: end-to-end percentiles, misses and what was dropped."""
    lines = ["{:<12}{:>8}{:>9}{:>9}{:>9}{:>9}{:>11}{:>9}".format("camera", "frames", "p50", "p99", "max", "misses",
                                                               "superseded", "expired")]
    for name, c in report["cameras"].items():
        e2e = c["stages_ms"].get("end_to_end", {})
        lines.append("{:<12}{:>8}{:>9.3f}{:>9.3f}{:>9.3f}{:>9}{:>11}{:>9}".format(
            name[:12], c["frames"], e2e.get("p50", 0.0), e2e.get("p99", 0.0), e2e.get("max", 0.0), c["misses"],
            c["superseded"] + c["skipped"], c["expired"]))
    batches = report.get("batches") or {}
    total = sum(batches.values())
    lines.append("batches: {} ({})".format(total, ", ".join("{} x{}".format(count, n) for n, count in batches.items())
                                           or "none"))
    return "\n".join(lines)
