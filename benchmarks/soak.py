"""Soak test of the daemon: 20,000 frames through `edge.service.loop.run` with everything a service runs switched
on (reader thread, ONNX Runtime, metrics HTTP server being scraped, sd_notify with a watchdog, telemetry
thread, JSON log), then resident memory, threads and open files compared with a baseline taken once the
process has settled.

Pass criteria (issue 5): RSS growth <= 5 % from the baseline to the end, no more threads, no more open files.

    .venv/bin/python benchmarks/soak.py                      # exports MobileNetV3-Small (random) to a temp dir
    .venv/bin/python benchmarks/soak.py --model engines/mobilenet_v3_small.onnx --frames 20000 --json soak.json

Small frames (64x48) at a high source rate keep the run to a few minutes on a CPU; the model input is still
224x224, so preprocessing and inference do their full work.
"""

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Dict, List, Optional

import psutil

from edge.config import load_config
from edge.infer.pipeline import Result, Sink
from edge.service.log import JsonLog
from edge.service.loop import run
from edge.service.runtime import Runtime

MAX_RSS_GROWTH = 0.05


class Probe(Sink):
    """Samples the process every `every` timed frames; scrapes the metrics endpoint every `scrape_every`."""

    def __init__(self, every: int, scrape_every: int, metrics_port: Optional[int] = None):
        self.every, self.scrape_every = every, scrape_every
        self.metrics_port = metrics_port
        self.process = psutil.Process()
        self.samples: List[Dict[str, Any]] = []
        self.frames = 0
        self.scrapes = 0
        self.started = time.monotonic()

    def sample(self) -> Dict[str, Any]:
        mem = self.process.memory_info()
        return {"frames": self.frames, "t_s": round(time.monotonic() - self.started, 1), "rss_mb": mem.rss / 2 ** 20,
                "threads": self.process.num_threads(), "fds": self.process.num_fds()}

    def on_result(self, result: Result) -> None:
        if result.status == "error":
            return
        self.frames += 1
        if self.metrics_port and self.frames % self.scrape_every == 0:
            url = "http://127.0.0.1:{}/metrics".format(self.metrics_port)
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read()
            self.scrapes += 1
        if self.frames % self.every == 0:
            self.samples.append(self.sample())


class NotifySocket:
    """A drained AF_UNIX datagram socket standing in for systemd's notify socket."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.counts: Dict[str, int] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096).decode()
            except socket.timeout:
                continue
            except OSError:
                return
            for line in data.split("\n"):
                key = line.split("=", 1)[0]
                self.counts[key] = self.counts.get(key, 0) + 1

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def soak(model: str, frames: int = 20000, baseline_at: int = 2000, every: int = 1000, fps: float = 500.0,
         width: int = 64, height: int = 48, log_path: str = os.devnull) -> Dict[str, Any]:
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="edge-soak-")
    notify_path = os.path.join(tmp, "notify.sock")
    notify = NotifySocket(notify_path)
    saved = {k: os.environ.get(k) for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    os.environ.update(NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="2000000")
    os.environ.pop("WATCHDOG_PID", None)
    cfg = load_config(None, {
        "model.path": model, "source.uri": "synthetic", "source.width": width, "source.height": height,
        "source.fps": fps, "backend.kind": "onnxruntime", "preprocess.device": "cpu", "runtime.frames": frames,
        "runtime.budget_ms": 30.0, "runtime.report_every": 1000, "service.metrics.enabled": True,
        "service.metrics.port": port, "service.telemetry.enabled": True, "service.telemetry.interval_s": 0.5})
    probe = Probe(every, scrape_every=500, metrics_port=port)
    log_file = open(log_path, "w", encoding="utf-8")
    try:
        runtime = Runtime(cfg, [probe], JsonLog(log_file))
        started = time.monotonic()
        report = run(runtime)
        wall = time.monotonic() - started
    finally:
        log_file.close()
        notify.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        try:
            os.remove(notify_path)
            os.rmdir(tmp)
        except OSError:
            pass
    base = next(s for s in probe.samples if s["frames"] >= baseline_at)
    end = probe.samples[-1]
    peak = max(s["rss_mb"] for s in probe.samples if s["frames"] >= baseline_at)
    growth = (end["rss_mb"] - base["rss_mb"]) / base["rss_mb"]
    result = {
        "frames": report["frames"], "wall_s": round(wall, 1), "fps": round(report["frames"] / wall, 1),
        "baseline_at_frame": base["frames"],
        "rss_mb": {"first_sample": round(probe.samples[0]["rss_mb"], 1), "baseline": round(base["rss_mb"], 1),
                   "end": round(end["rss_mb"], 1), "peak_after_baseline": round(peak, 1)},
        "rss_growth_pct": round(growth * 100, 2),
        "threads": {"baseline": base["threads"], "end": end["threads"]},
        "fds": {"baseline": base["fds"], "end": end["fds"]},
        "end_to_end_ms": report["stages_ms"]["end_to_end"], "misses": report["misses"], "errors": report["errors"],
        "skipped": report["skipped"], "scrapes": probe.scrapes, "notify": dict(notify.counts),
        "samples": [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in s.items()} for s in probe.samples],
    }
    result["pass"] = bool(growth <= MAX_RSS_GROWTH and end["threads"] <= base["threads"]
                          and end["fds"] <= base["fds"] and report["frames"] == frames)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="ONNX model (default: export MobileNetV3-Small with random weights)")
    parser.add_argument("--frames", type=int, default=20000)
    parser.add_argument("--baseline-at", type=int, default=2000, help="frame at which the baseline is taken")
    parser.add_argument("--fps", type=float, default=500.0, help="synthetic source rate")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from edge.model.export import export_model

        model = os.path.join(tempfile.mkdtemp(prefix="edge-soak-model-"), "mobilenet_v3_small.onnx")
        export_model("mobilenet_v3_small", "random", model, log=lambda *a: None)
    result = soak(model, args.frames, args.baseline_at, fps=args.fps)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    print("soak: {} frames in {} s; RSS {} -> {} MB ({:+.2f} %), threads {} -> {}, fds {} -> {}: {}".format(
        result["frames"], result["wall_s"], result["rss_mb"]["baseline"], result["rss_mb"]["end"],
        result["rss_growth_pct"], result["threads"]["baseline"], result["threads"]["end"],
        result["fds"]["baseline"], result["fds"]["end"], "PASS" if result["pass"] else "FAIL"), file=sys.stderr)
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
