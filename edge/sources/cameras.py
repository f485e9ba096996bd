"""The cameras of a run, 1..N, on one engine (config `sources`, else the one `source`): one path for any number.

    cameras = Cameras(camera_cfgs, cfg.runtime, capture_factory, reconnect_initial_s=..., reconnect_max_s=...,
                      on_event=log).start(stages)
    batch = cameras.next_batch(wait_s)     # the frames the deadline batcher chose to serve now, or None
    results = pipeline.process_batch(batch.frames, [c.name for c in batch.cameras], timed)
    cameras.finished(batch, results, timed)  # per-camera figures; the batcher learns the batch's cost and misses

Each camera's reader thread publishes its frames straight into its slot in the batcher (newest wins: the frame it
replaces counts as `skipped`); there is no other queue and no hand-over thread. One camera is a batch of one,
served on arrival. One watcher thread carries out what each camera's Watch (edge/sources/watch.py) decides, so a
camera that dies, hangs or reconnects delays no other. The scheduling is edge/sources/batcher.py's (policy only);
what the engine costs per batch size is measured here, at start (each size run a few times, several cameras) and
from every batch served.
"""

import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from edge.config import CameraConfig, RuntimeConfig
from edge.errors import EdgeError
from edge.infer.pipeline import Frame, Result
from edge.sources.batcher import CostModel, DeadlineBatcher
from edge.sources.capture import Capture, SourceEnded
from edge.sources.reader import Staging
from edge.sources.source import Camera
from edge.sources.watch import Backoff

SEED_RUNS = 5  # timed runs of each batch size at start (after one untimed), whose median seeds its cost
WATCH_S = 0.25  # the watcher looks at every camera at least this often


@dataclass
class Batch:
    """Frames the batcher chose to serve together, at most one per camera, and their cameras."""

    frames: List[Frame]
    cameras: List[Camera]


class Cameras:
    """The cameras of one run, the deadline batcher their readers publish into, and the watcher thread."""

    def __init__(self, cameras: Sequence[CameraConfig], runtime: RuntimeConfig,
                 capture_factory: Callable[[Any], Capture], *, reconnect_initial_s: float, reconnect_max_s: float,
                 on_event: Callable[[str, Dict[str, Any]], None], give_up_at_start: bool = True):
        self.runtime = runtime
        self.batch_sizes: Dict[int, int] = {}  # frames per batch -> batches served
        self._cond = threading.Condition()
        self._error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._poke = threading.Event()  # a reader changed: the watcher looks now
        self._watcher: Optional[threading.Thread] = None
        several = len(cameras) > 1
        self.cameras = [Camera(i, cfg, capture_factory, publish=self._offer, on_event=on_event, changed=self._changed,
                               backoff=Backoff(reconnect_initial_s, reconnect_max_s),
                               give_up_at_start=give_up_at_start, budget_ms=runtime.budget_ms,
                               window=runtime.latency_window,
                               label="{} ({}): ".format(cfg.key, cfg.name) if several else "")
                        for i, cfg in enumerate(cameras)]
        self.batcher = DeadlineBatcher([1.0 / c.fps for c in cameras], budget=runtime.budget_ms / 1e3,
                                       max_batch=1, max_wait=runtime.batching.max_wait_ms / 1e3,
                                       margin=runtime.batching.margin_ms / 1e3)

    @property
    def several(self) -> bool:
        return len(self.cameras) > 1

    @property
    def description(self) -> str:
        if not self.several:
            return self.cameras[0].description
        return "{} cameras: {}".format(len(self.cameras), ", ".join(
            "{} ({})".format(c.name, c.description) for c in self.cameras))

    def start(self, stages: Any = None) -> "Cameras":
        """Measure what each batch size costs on `stages` (several cameras; None: batch 1, unmeasured), then open
        every camera and watch."""
        if stages is not None:
            self.restage(stages)
        try:
            for camera in self.cameras:
                camera.start()
        except BaseException:  # a file that cannot be opened: the cameras started before it stop again
            self.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="edge-watcher")
        self._watcher.start()
        return self

    def restage(self, stages: Any) -> None:
        """The stages that serve now (at start, after a reload): the batch sizes they take, their costs, and the
        GPU preprocessor's staging buffers to read into."""
        batching = self.runtime.batching
        largest = 1 if batching.policy == "off" else min(batching.max_batch, stages.backend.max_batch,
                                                          len(self.cameras))
        cost = seed_costs(stages, largest, (self.cameras[0].cfg.height, self.cameras[0].cfg.width)) \
            if self.several else CostModel()
        with self._cond:
            self.batcher.max_batch = self.batcher.limit = largest
            self.batcher.cost = cost
        staging: Optional[Staging] = getattr(stages.preprocess, "staging_buffers", None)
        for camera in self.cameras:
            camera.set_staging(staging)

    def _offer(self, camera: Camera, frame: Frame) -> None:
        """A reader's new frame into its camera's slot (the frame it replaces is skipped)."""
        with self._cond:
            old = self.batcher.offer(camera.index, frame.captured, time.monotonic(), frame)
            camera.slot = frame
            if old is not None:
                with camera.lock:
                    camera.stats.skipped += 1
            self._cond.notify_all()

    def _changed(self) -> None:
        self._poke.set()
        with self._cond:
            self._cond.notify_all()

    def _watch(self) -> None:
        """The watcher: each camera's Watch verdict carried out, until stopped or one gives up (the run's error)."""
        while not self._stop.is_set():
            now, wake = time.monotonic(), time.monotonic() + WATCH_S
            try:
                for camera in self.cameras:
                    at = camera.watch_once(now)
                    wake = min(wake, at) if at is not None else wake
            except Exception as exc:  # a camera given up (EdgeError), or a fresh capture that could not be made
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            self._poke.wait(max(0.0, wake - time.monotonic()))
            self._poke.clear()

    def next_batch(self, wait_s: float) -> Optional[Batch]:
        """The next batch the batcher chose within `wait_s`, else None. Raises a camera's start failure or a file's
        error, and SourceEnded once every camera (files, folders) has ended and nothing waits."""
        give_up = time.monotonic() + wait_s
        batcher = self.batcher
        with self._cond:
            while True:
                self._raise_failure()
                now = time.monotonic()
                decision = batcher.decide(now)
                for pending in decision.expired:
                    camera = self.cameras[pending.camera]
                    camera.slot = None
                    with camera.lock:
                        camera.stats.expired += 1
                if decision.serve:
                    return self._take([self.cameras[p.camera] for p in decision.serve],
                                      [p.item for p in decision.serve])
                if all(c.reader.ended for c in self.cameras) and not batcher.pending():
                    raise SourceEnded(self.description)
                if now >= give_up:
                    return None
                wake = give_up if decision.wake_at is None else min(give_up, decision.wake_at)
                self._cond.wait(max(0.0, wake - now))

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error
        for camera in self.cameras:
            error = camera.reader.error
            if error is not None:
                if isinstance(error, EdgeError) or not self.several:
                    raise error
                raise EdgeError("{}{}: {}: {}".format(camera.label, camera.cfg.uri, type(error).__name__, error))

    def _take(self, cameras: List[Camera], frames: List[Frame]) -> Batch:
        for camera in self.cameras:
            camera.held = []
        for camera, frame in zip(cameras, frames):
            camera.slot, camera.held = None, [frame]
        return Batch(frames, cameras)

    def finished(self, batch: Batch, results: Sequence[Result], timed: int) -> None:
        """A served batch (its first `timed` results timed): per-camera figures, and its cost and any miss to the
        batcher."""
        service_ms = 0.0
        for i, (camera, result) in enumerate(zip(batch.cameras, results)):
            if result.status == "error":
                camera.errors += 1
                continue
            service_ms = result.stage_ms["end_to_end"] - result.stage_ms["frame_age"]
            if i < timed:
                camera.recorder.record(result.stage_ms)
        self.batch_sizes[len(results)] = self.batch_sizes.get(len(results), 0) + 1
        if service_ms:
            with self._cond:
                self.batcher.finished(len(results), service_ms / 1e3, any(r.status == "miss" for r in results))

    @property
    def degraded(self) -> Optional[str]:
        """Why the cameras are served best effort now (no frame can make its budget), or None."""
        return self.batcher.overloaded

    def stats(self) -> Dict[str, int]:
        """The cameras' counters, summed."""
        total: Dict[str, int] = {}
        for camera in self.cameras:
            for key, value in camera.counters().items():
                total[key] = total.get(key, 0) + value
        return total

    def counters(self) -> Dict[str, Dict[str, int]]:
        """Each camera's counters and its timed frames and misses, as data (several cameras; else empty)."""
        if not self.several:
            return {}
        return {c.name: dict(c.counters(), frames=c.recorder.frames, misses=c.recorder.misses, errors=c.errors)
                for c in self.cameras}

    def drops(self) -> Dict[str, Dict[str, int]]:
        """Each camera's frames never served: superseded by its newer frame, and expired."""
        return {name: {"superseded": c["skipped"], "expired": c["expired"]} for name, c in self.counters().items()}

    def facts(self) -> Dict[str, Any]:
        """What the start line adds for several cameras."""
        if not self.several:
            return {}
        return {"cameras": [c.name for c in self.cameras], "batching": self.runtime.batching.policy,
                "max_batch": self.batcher.max_batch}

    def figures(self) -> Dict[str, Any]:
        """Per-camera figures and the batches served, for the final report (several cameras)."""
        if not self.several:
            return {}
        return {"cameras": {c.name: c.figures() for c in self.cameras},
                "batches": {str(n): count for n, count in sorted(self.batch_sizes.items())},
                "batch_limit": self.batcher.limit, "max_batch": self.batcher.max_batch}

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()
        if self._watcher is not None:
            self._watcher.join(timeout=WATCH_S * 4)
        for camera in self.cameras:
            camera.stop()


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
            c["skipped"], c["expired"]))
    batches = report.get("batches") or {}
    total = sum(batches.values())
    lines.append("batches: {} ({})".format(total, ", ".join("{} x{}".format(count, n) for n, count in batches.items())
                                           or "none"))
    return "\n".join(lines)
