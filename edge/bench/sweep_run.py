"""The run of `edge sweep` (edge/cli/sweep.py is its command line): cells of N synthetic cameras through the
service's Runtime and loop on one loaded model (open loop), or batches back to back (closed loop), in windows
interleaved round by round until each cell's last windows agree; then the report (edge/bench/sweep_report.py),
the figure (edge/bench/sweep_figure.py), the CSV and the JSON.
"""

import io
import os
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from edge.bench.sweep_options import SweepOptions, check_sweep
from edge.bench.sweep_report import (
    Window,
    agree,
    build_report,
    cell_figures,
    compare,
    format_report,
    load_previous,
    to_csv,
)
from edge.config import Config, with_overrides
from edge.errors import EdgeError, first_line
from edge.infer.pipeline import Result, Sink
from edge.sources.capture import Capture, SyntheticCapture
from edge.store.fileio import atomic_write, write_json_atomic

WARMUP_FRAMES = 10  # per window, after the start: the first runs of each batch size allocate


class SweepCamera(Capture):
    """A synthetic camera at `fps` from its own phase, each frame due within +-`jitter_s` of its slot; `reads` keeps
    when each frame was read (frame seq n: reads[n - 1]), so a window counts what was offered in it."""

    live = True

    def __init__(self, frames: List[np.ndarray], *, fps: float, phase_s: float, jitter_s: float, seed: int):
        self.frames, self.period, self.phase_s, self.jitter_s = frames, 1.0 / fps, phase_s, jitter_s
        self.rng = random.Random(seed)
        self.description = "synthetic {}x{}@{:g}, phase {:.1f} ms, jitter {:g} ms".format(
            frames[0].shape[1], frames[0].shape[0], fps, phase_s * 1e3, jitter_s * 1e3)
        self.start = 0.0
        self.reads: List[float] = []

    def open(self) -> None:
        self.start = time.monotonic() + self.phase_s

    def pace(self) -> None:
        due = self.start + len(self.reads) * self.period + self.rng.uniform(-self.jitter_s, self.jitter_s)
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def read(self, into: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        self.reads.append(time.monotonic())
        return self.frames[len(self.reads) % len(self.frames)]


class PeakMemory:
    """The process's peak resident memory over a stretch of time: Linux's high-water mark (VmHWM), reset at the
    start by writing 5 to /proc/self/clear_refs; where that cannot be done, the peak since the process started."""

    def __init__(self, proc: str = "/proc/self"):
        self.proc = proc

    def reset(self) -> None:
        try:
            with open(os.path.join(self.proc, "clear_refs"), "w", encoding="utf-8") as fh:
                fh.write("5")
        except OSError:  # not Linux, or a kernel before 4.0: the lifetime peak it is
            pass

    def peak_mb(self) -> Optional[float]:
        try:
            with open(os.path.join(self.proc, "status"), encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024.0
        except (OSError, ValueError, IndexError):
            pass
        try:
            import resource
        except ImportError:
            return None
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20 if sys.platform == "darwin" else 1024)


class WindowSink(Sink):
    """Keeps what each timed frame of a window did; asks the loop to stop `seconds` after the first one."""

    def __init__(self, seconds: float, stop: Any, cameras: Dict[str, SweepCamera]):
        self.seconds, self.stop, self.cameras = seconds, stop, cameras
        self.results: List[Result] = []
        self.t0: Optional[float] = None
        self.cpu0 = 0.0
        self.window: Optional[Window] = None

    def on_result(self, result: Result) -> None:
        if result.status == "error" or self.window is not None:
            return
        now = time.monotonic()
        if self.t0 is None:
            self.t0, self.cpu0 = now, time.process_time()
        self.results.append(result)
        if now - self.t0 >= self.seconds:
            self.finish()
            self.stop.request("window")

    def finish(self) -> Window:
        """The window: the frames read from the first served one's read to the last served one's, what was served
        of those, and the drops among them (a frame with a later frame of its camera served is gone for good; the
        frames after a camera's last served one may still be waiting, and are no drops)."""
        if self.window is not None:
            return self.window
        w = self.window = Window(0.0)
        if not self.results:
            return w
        read_at = [self.cameras[r.camera or "cam0"].reads[r.seq - 1] for r in self.results]
        t0, t1 = read_at[0], max(read_at)
        w.seconds = t1 - t0 + min(c.period for c in self.cameras.values())  # k + 1 frames of a camera: k + 1 periods
        w.offered = sum(t0 <= t <= t1 for camera in self.cameras.values() for t in list(camera.reads))
        served: Dict[str, List[int]] = {name: [] for name in self.cameras}
        for result, at in zip(self.results, read_at):
            if at < t0:
                continue
            served[result.camera or "cam0"].append(result.seq)
            for name, values in w.stage_ms.items():
                values.append(result.stage_ms.get(name, 0.0))
            w.batch.append(result.batch)
            w.camera.append(result.camera or "cam0")
            w.ok.append(result.status == "ok")
        for name, camera in self.cameras.items():
            if served[name]:
                last = max(served[name])
                settled = sum(t0 <= t for t in camera.reads[:last])  # frames 1..last read in the window
                w.produced += settled
                w.dropped += settled - len(served[name])
        w.cpu_s = time.process_time() - self.cpu0
        snap = self.results[-1].telemetry
        if snap is not None:
            w.ram_fraction = getattr(snap, "ram_fraction", None)  # a Jetson's (jtop) is the RAM CPU and GPU share
        if snap is not None and getattr(snap, "source", "") == "jtop":
            w.gpu_load, w.emc_mhz = getattr(snap, "gpu_load", None), getattr(snap, "emc_freq_mhz", None)
        return w


def open_window(cfg: Config, stages: Any, frames: List[np.ndarray], *, streams: int, batch: int, fps: float,
                jitter_s: float, seconds: float, seed: int) -> Window:
    """One window of an open-loop cell: `edge run`'s Runtime and loop with `streams` sweep cameras."""
    from edge.service.log import JsonLog
    from edge.service.loop import run
    from edge.service.runtime import Runtime
    from edge.service.signals import StopFlag

    rng = random.Random(seed)
    cameras = {"cam{}".format(i): SweepCamera(frames, fps=fps, phase_s=rng.uniform(0.0, 1.0 / fps), jitter_s=jitter_s,
                                              seed=rng.randrange(1 << 30)) for i in range(streams)}
    window_cfg = with_overrides(cfg, {"sources": [{"name": name} for name in cameras], "source.fps": fps,
                                      "runtime.batching.max_batch": batch, "runtime.frames": 0,
                                      "runtime.warmup": WARMUP_FRAMES, "service.metrics.enabled": False})
    stop = StopFlag()
    sink = WindowSink(seconds, stop, cameras)
    runtime = Runtime(window_cfg, [sink], JsonLog(stream=io.StringIO()),
                      capture_factory=lambda camera: cameras[getattr(camera, "name", "cam0")], stages=stages)
    memory = PeakMemory()
    memory.reset()
    run(runtime, stop)
    window = sink.finish()
    window.peak_rss_mb = memory.peak_mb()
    return window


def closed_window(stages: Any, image: np.ndarray, *, batch: int, seconds: float, budget_ms: float) -> Window:
    """One window of a closed-loop cell: batches of `batch` back to back, nothing waiting (engine capacity)."""
    w = Window(seconds)
    memory = PeakMemory()
    memory.reset()
    for _ in range(2):  # warm: the first runs of a size allocate
        stages.classify_batch([image] * batch, {})
    t0, cpu0 = time.monotonic(), time.process_time()
    while time.monotonic() - t0 < seconds:
        stage_ms: Dict[str, float] = {}
        started = time.monotonic()
        stages.classify_batch([image] * batch, stage_ms)
        stage_ms.update(frame_age=0.0, end_to_end=(time.monotonic() - started) * 1e3)
        for _ in range(batch):
            for name, values in w.stage_ms.items():
                values.append(stage_ms.get(name, 0.0))
            w.batch.append(batch)
            w.camera.append("closed")
            w.ok.append(stage_ms["end_to_end"] <= budget_ms)
    w.seconds, w.cpu_s = time.monotonic() - t0, time.process_time() - cpu0
    w.produced, w.peak_rss_mb = w.frames, memory.peak_mb()
    return w


class Progress:
    """A bar on stderr when it is a terminal; nothing otherwise (logs and pipes get the table only)."""

    def __init__(self, total: int, stream: Any = None):
        self.stream = stream or sys.stderr
        self.total, self.done = total, 0
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, label: str) -> None:
        self.done += 1
        if self.enabled:
            filled = int(30 * min(self.done, self.total) / max(1, self.total))
            self.stream.write("\r[{}{}] {}/{} windows {:<24}".format("#" * filled, "." * (30 - filled), self.done,
                                                                    self.total, label))
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def sweep_cells(cfg: Config, stages: Any, cells: List[Tuple[int, int]], options: SweepOptions,
                progress: Progress) -> List[Dict[str, Any]]:
    """Every cell's windows, round by round, until each agrees or has --max-windows; their figures."""
    frames = synthetic_frames(cfg)
    history: Dict[Tuple[int, int], List[Window]] = {cell: [] for cell in cells}
    window_s = options.duration / options.windows
    for round_ in range(options.max_windows):
        todo = [c for c in cells if round_ < options.windows or not agree(history[c], options.windows,
                                                                           options.agree_pct)]
        if not todo:
            break
        if round_ == options.windows:
            progress.total += len(todo) * (options.max_windows - options.windows)
        for streams, batch in todo:
            if options.load == "closed":
                window = closed_window(stages, frames[0], batch=batch, seconds=window_s,
                                       budget_ms=cfg.runtime.budget_ms)
            else:
                window = open_window(cfg, stages, frames, streams=streams, batch=batch, fps=options.fps,
                                     jitter_s=options.jitter_ms / 1e3, seconds=window_s,
                                     seed=options.seed + 1000 * round_ + 10 * streams + batch)
            history[(streams, batch)].append(window)
            progress.step("{} cameras x batch {}".format(streams, batch))
    out = []
    for (streams, batch), windows in history.items():
        stable = agree(windows, options.windows, options.agree_pct)
        fps = options.fps if options.load == "open" else None
        out.append(cell_figures(windows[-options.windows:], streams=streams, batch=batch, fps=fps,
                                budget_ms=cfg.runtime.budget_ms, stable=stable, all_windows=len(windows),
                                context_memory_mb=stages.facts().get("context_memory_mb")))
    return out


def synthetic_frames(cfg: Config) -> List[np.ndarray]:
    capture = SyntheticCapture(cfg.source.width, cfg.source.height, cfg.source.fps, variants=4)
    capture.open()
    return capture.frames


def run_sweep(cfg: Config, options: SweepOptions, out: Callable[[str], None] = print,
              progress_stream: Any = None) -> Dict[str, Any]:
    """The sweep `options` describe with config `cfg`; returns the report (its verdict in report['verdict'])."""
    from edge.board import clock_state, system_info
    from edge.infer.stages import build_stages

    check_sweep(options)
    previous = load_previous(options.compare) if options.compare else None  # refused before any cell runs
    cfg = with_overrides(cfg, {"runtime.latency_window": max(cfg.runtime.latency_window, 100000)})
    stages = build_stages(cfg)
    try:
        largest = max(options.batch)
        if largest > stages.backend.max_batch:
            raise EdgeError("--batch {}: {} takes batch {} at most; export it with: edge export --batch dynamic".format(
                largest, cfg.model.path, stages.backend.max_batch))
        cells = [(b, b) for b in options.batch] if options.load == "closed" else \
            [(s, b) for s in options.streams for b in options.batch]
        progress = Progress(len(cells) * options.windows, progress_stream)
        try:
            results = sweep_cells(cfg, stages, cells, options, progress)
        finally:
            progress.close()
        facts = dict(stages.facts(), model=cfg.model.path, warning=stages.warning)
    finally:
        stages.close()
    settings = {"load": options.load, "fps": options.fps if options.load == "open" else None,
                "budget_ms": cfg.runtime.budget_ms, "drop_budget_pct": options.drop_budget_pct,
                "duration_s": options.duration, "windows": options.windows, "max_windows": options.max_windows,
                "agree_pct": options.agree_pct, "jitter_ms": options.jitter_ms, "batching": "deadline",
                "max_wait_ms": cfg.runtime.batching.max_wait_ms, "margin_ms": cfg.runtime.batching.margin_ms,
                "frame": [cfg.source.width, cfg.source.height]}
    report = build_report(results, settings, facts, system_info(clock_state()[0]))
    if previous is not None:
        report["comparison"] = compare(results, previous, options.compare, pct=options.regression_pct,
                                       ms=options.regression_ms)
    write_outputs(report, options)
    out(format_report(report))
    return report


def write_outputs(report: Dict[str, Any], options: SweepOptions) -> None:
    """The JSON report first, then the CSV and the figure: an output that fails (a full disk, /proc/x.png) is named
    in report['output_errors'] (and the JSON written again to say so) without costing the others."""
    from edge.bench.report import figure_facts
    from edge.bench.sweep_figure import plot

    if options.plot:
        report["figure"] = figure_facts(options.plot)
    writers = {"JSON report": lambda path: write_json_atomic(path, report, "JSON report"),
               "CSV": lambda path: atomic_write(path, lambda fh: fh.write(to_csv(report).encode("utf-8")), "CSV"),
               "figure": lambda path: plot(path, report)}
    failed = report["output_errors"] = []
    for path, what in options.outputs():
        try:
            writers[what](path)
        except Exception as exc:  # any output's failure is reported; the others are kept
            failed.append("{} {}: not written: {}".format(what, path, first_line(exc)))
    if failed and options.json and not failed[0].startswith("JSON report"):
        if options.plot and any(f.startswith("figure") for f in failed):
            report["figure"] = None
        try:
            write_json_atomic(options.json, report, "JSON report")
        except Exception as exc:  # the first JSON stands
            failed.append("JSON report {}: not updated: {}".format(options.json, first_line(exc)))
