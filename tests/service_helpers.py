"""Helpers shared by the service tests: a real sd_notify listener, free ports, a running process's JSON lines, config
files, injectable sources and backends, the service loop on a thread. Each is defined here only (tests/test_static.py
refuses a second definition)."""

import functools
import json
import os
import shutil
import socket
import threading
import time

import numpy as np
import onnx
import yaml

from edge.config import CameraConfig, RuntimeConfig, load_config
from edge.infer.onnxruntime_backend import OnnxRuntimeBackend
from edge.infer.preprocess import CpuPreprocessor
from edge.service.log import JsonLog
from edge.service.loop import run
from edge.service.runtime import Runtime
from edge.service.signals import StopFlag
from edge.sources.cameras import Cameras
from edge.sources.source import Capture, SyntheticCapture
from edge.store.artifact import sha256_file


class NotifyListener:
    """A real AF_UNIX datagram socket, like systemd's notify socket; collects (time, message) pairs.

    `abstract=True` binds in the abstract namespace and exports the `@name` form of NOTIFY_SOCKET."""

    def __init__(self, tmp_path, abstract=False):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = "edge-test-{}-{}".format(os.getpid(), id(self))
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            self.address = str(tmp_path / "notify.sock")
            self.sock.bind(self.address)
        self.sock.settimeout(0.1)
        self.messages = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode()))

    def fields(self):
        """Every KEY=value line received, with its arrival time."""
        return [(t, line) for t, msg in list(self.messages) for line in msg.split("\n") if line]

    def lines(self, key):
        return [(t, line) for t, line in self.fields() if line.startswith(key + "=")]

    def wait_for(self, key, timeout=20.0, after=0.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [(t, line) for t, line in self.lines(key) if t >= after]
            if hits:
                return hits[0]
            time.sleep(0.02)
        raise AssertionError("no {}= within {} s; got {}".format(key, timeout, self.fields()))

    def close(self):
        self._stop.set()
        self._thread.join(timeout=1)
        self.sock.close()
        if not self.address.startswith("@") and os.path.exists(self.address):
            os.remove(self.address)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_lines(text):
    out = []
    for line in text.splitlines():
        if line.startswith("<") and ">" in line[:4]:
            line = line[line.index(">") + 1:]
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


class JsonLines:
    """The JSON lines a process prints on stdout (json_lines), read on a thread as they come; `wait_for` takes them
    in order."""

    def __init__(self, proc):
        self.proc = proc
        self.records = []  # every JSON line so far
        self.text = []  # every line so far, for failure messages
        self.taken = 0  # how many records wait_for has gone past
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.text.append(line)
            self.records.extend(json_lines(line))

    def wait_for(self, match, timeout=30.0):
        """The next record `match` accepts (an event name, or a predicate on the record), within `timeout` s; those
        before it are passed over. Fails when the output ends (the process exited) or the time runs out."""
        accepts = (lambda record: record.get("event") == match) if isinstance(match, str) else match
        deadline = time.monotonic() + timeout
        while True:
            ended = not self.thread.is_alive()  # read before the records: none can come after it
            while self.taken < len(self.records):
                self.taken += 1
                if accepts(self.records[self.taken - 1]):
                    return self.records[self.taken - 1]
            if ended or time.monotonic() > deadline:
                raise AssertionError("{} not seen: {}; last lines:\n{}{}".format(
                    match if isinstance(match, str) else "the line waited for",
                    "the output ended" if ended else "timed out after {} s".format(timeout),
                    "".join(self.text[-20:])[-2000:], self._stderr()))
            time.sleep(0.02)

    def _stderr(self):
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return "\nstderr:\n" + self.proc.stderr.read()[-2000:]


def ansible_env(temp, **more):
    """The environment of every ansible-playbook and ansible-lint run: Ansible refuses a locale whose encoding is
    not UTF-8 (a machine's LANG may be C, unset or another encoding), so C.UTF-8; no colour; its temps under `temp`
    (the "remote" one too: with USER naming no account, `~` would not expand and land in the checkout)."""
    env = dict(os.environ, LC_ALL="C.UTF-8", ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(temp),
               ANSIBLE_REMOTE_TMP=os.path.join(str(temp), "remote"))
    env.update(more)
    return env


def write_config(path, data):
    """`data` written as YAML at `path` (a config file); returns the path."""
    with open(str(path), "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh)
    return str(path)


def copy_model(model, dest_dir, stem):
    """Install a copy of `model` (with its labels and info sidecar) as dest_dir/stem.onnx."""
    os.makedirs(str(dest_dir), exist_ok=True)
    base = os.path.splitext(model)[0]
    for ext in (".onnx", ".labels.txt", ".json"):
        if os.path.exists(base + ext):
            shutil.copy(base + ext, os.path.join(str(dest_dir), stem + ext))
    return os.path.join(str(dest_dir), stem + ".onnx")


def first_images(set_dir, count, dest):
    """The first `count` images of the calibration set `set_dir`, imported as a set of their own at `dest`: a
    shipped set's images and format, for less work than all of them."""
    from edge.model.calibration import import_calibration_set

    raw = dest + ".raw"
    os.makedirs(raw)
    for name in sorted(n for n in os.listdir(set_dir) if n != "manifest.json")[:count]:
        shutil.copy(os.path.join(set_dir, name), raw)
    import_calibration_set(raw, dest, min_images=count, log=lambda *a: None)
    shutil.rmtree(raw)
    return dest


# ORT's idle threads spin by default and burn a core for as long as a frame loop runs, and a batch-1 run of these
# small models costs 2-3x the CPU on two threads: a test that is not about ORT threading or speed runs one thread
# that blocks (backend.intra_op_threads, backend.intra_op_spinning)
QUIET_ORT = {"intra_op_threads": 1, "intra_op_spinning": False}


def service_config(model, **overrides):
    """A fast in-process config: tiny synthetic frames, CPU stages (QUIET_ORT), quick reconnects, no
    metrics/telemetry."""
    values = {"model.path": model, "source.uri": "synthetic", "source.width": 96, "source.height": 72,
              "source.fps": 100.0, "source.timeout_s": 0.5, "backend.kind": "onnxruntime",
              **{"backend." + key: value for key, value in QUIET_ORT.items()},
              "preprocess.device": "cpu", "runtime.warmup": 2, "runtime.budget_ms": 1000.0,
              "service.metrics.enabled": False, "service.telemetry.enabled": False,
              "service.reconnect_initial_s": 0.05, "service.reconnect_max_s": 0.2}
    values.update(overrides)
    return load_config(None, values)


class SourceTimeout(Exception):
    """CameraReader.get: no frame within its wait."""


class CameraReader:
    """One capture read as the service reads a camera (edge.sources.cameras.Cameras: its reader, watcher and batch
    of one), without stages: `get()` the newest frame not served yet, `stats()` its counters, `events` its events."""

    def __init__(self, capture, timeout_s=2.0, start_timeout_s=10.0, reconnect_initial_s=0.05, reconnect_max_s=0.2,
                 give_up_at_start=True):
        """`capture`: a Capture, or a function that makes a fresh one (a hung one is abandoned for another)."""
        self.events = []
        cfg = CameraConfig(name="camera", timeout_s=timeout_s, start_timeout_s=start_timeout_s)
        runtime = RuntimeConfig(budget_ms=3600e3)  # no frame expires: the test is the consumer, as slow as it likes
        factory = (lambda _: capture()) if not isinstance(capture, Capture) else (lambda _: capture)
        self.cameras = Cameras([cfg], runtime, factory, reconnect_initial_s=reconnect_initial_s,
                               reconnect_max_s=reconnect_max_s, on_event=lambda *event: self.events.append(event),
                               give_up_at_start=give_up_at_start).start()
        self.camera = self.cameras.cameras[0]

    def get(self, timeout_s=10.0):
        batch = self.cameras.next_batch(timeout_s)
        if batch is None:
            raise SourceTimeout("no frame for {} s".format(timeout_s))
        return batch.frames[0]

    def stats(self):
        return self.cameras.stats()

    def names(self):
        return [name for name, _ in self.events]

    def stop(self):
        self.cameras.stop()


class ListLog(JsonLog):
    """JsonLog that keeps the records (and still formats them as the real one does)."""

    def __init__(self):
        super().__init__(stream=open(os.devnull, "w", encoding="utf-8"))
        self.records = []
        self._lock = threading.Lock()

    def __call__(self, event, level="info", **fields):
        with self._lock:
            self.records.append(dict(fields, event=event, level=level))
        super().__call__(event, level, **fields)

    def events(self, name):
        with self._lock:
            return [r for r in self.records if r["event"] == name]


class DropoutCapture(SyntheticCapture):
    """A synthetic camera that goes away: after `good` frames, reads return None (lost stream) and opening
    fails until `down_s` seconds have passed, then it works again."""

    def __init__(self, good=30, down_s=0.6, fail_with=None):
        super().__init__(64, 48, 200.0, variants=2)
        self.description = "dropout camera"
        self.good, self.down_s, self.fail_with = good, down_s, fail_with
        self.reads = 0
        self.opens = 0
        self.down_until = None

    def open(self):
        self.opens += 1
        if self.down_until is not None and time.monotonic() < self.down_until:
            raise IOError("camera not present")
        if not self.frames:
            super().open()

    def read(self):
        self.reads += 1
        if self.down_until is None and self.reads > self.good:
            self.down_until = time.monotonic() + self.down_s
        if self.down_until is not None and time.monotonic() < self.down_until:
            if self.fail_with is not None:
                raise self.fail_with
            return None
        return super().read()


class BrokenFramesCapture(SyntheticCapture):
    """Delivers `broken` empty images in a row after `good` frames, then recovers (after a reopen)."""

    live = True

    def __init__(self, good=10, broken=8):
        super().__init__(64, 48, 200.0, variants=2)
        self.good, self.broken_left = good, broken
        self.reads = 0

    def read(self):
        self.reads += 1
        if self.reads > self.good and self.broken_left > 0:
            self.broken_left -= 1
            return np.zeros((0, 0, 3), np.uint8)
        return super().read()


class HangingCapture(SyntheticCapture):
    """The first instance hangs in read() (a driver that never returns) after `good` frames; `release` ends it."""

    instances = []

    def __init__(self, good=20):
        super().__init__(64, 48, 200.0, variants=2)
        self.good = good if not HangingCapture.instances else 10 ** 9
        self.reads = 0
        self.release = threading.Event()
        self.closed = False
        HangingCapture.instances.append(self)

    def read(self):
        self.reads += 1
        if self.reads > self.good:
            self.release.wait(30)
            return None
        return super().read()

    def close(self):
        self.closed = True


class RaisingCapture(Capture):
    """A camera whose open() and read() raise: the first `bad_opens` reopenings fail."""

    live = True
    description = "raising camera"

    def __init__(self, bad_opens=3, good=5):
        self.bad_opens, self.good = bad_opens, good
        self.opens = 0
        self.reads = 0

    def open(self):
        self.opens += 1
        if 1 < self.opens <= 1 + self.bad_opens:
            raise IOError("device busy")

    def read(self):
        self.reads += 1
        time.sleep(0.002)
        if self.opens == 1 and self.reads > self.good:
            raise IOError("VIDIOC_DQBUF: No such device")
        return np.full((48, 64, 3), self.reads % 255, np.uint8)


class ControlledBackend(OnnxRuntimeBackend):
    """The real ONNX Runtime backend, with hooks on what it loads: hang on an Event, fail or slow down chosen
    inferences (the blank run of the load is not counted)."""

    def __init__(self, model, slow_every=0, slow_s=0.0, fail_every=0):
        super().__init__(model, 1, spinning=False)
        self.calls = 0
        self.slow_every, self.slow_s, self.fail_every = slow_every, slow_s, fail_every
        self.hang = threading.Event()  # set: the next infer() blocks until `release` is set
        self.release = threading.Event()
        self.hanging = threading.Event()

    def _load(self, model):
        loaded = super()._load(model)
        loaded.infer = functools.partial(self._infer, loaded.infer)  # what the frame path calls from now on
        return loaded

    def _infer(self, infer, tensor):
        self.calls += 1
        if self.hang.is_set():
            self.hanging.set()
            self.release.wait(30)
            self.hang.clear()
            self.hanging.clear()
        if self.fail_every and self.calls % self.fail_every == 0:
            raise RuntimeError("injected inference failure")
        if self.slow_every and self.calls % self.slow_every == 0:
            time.sleep(self.slow_s)
        return infer(tensor)


def stages_with(backend):
    """A stages_factory for Runtime: CPU preprocessing and the given backend."""
    def factory(cfg):
        return CpuPreprocessor(cfg.preprocess), backend, "test backend"
    return factory


def run_in_thread(runtime):
    """edge.service.loop.run(runtime) on a thread: (its StopFlag, the thread, a dict that gets the "report")."""
    stop, outcome = StopFlag(), {}
    thread = threading.Thread(target=lambda: outcome.setdefault("report", run(runtime, stop)))
    thread.start()
    return stop, thread, outcome


def wait_until(predicate, timeout=10.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def run_in_process(cfg, log, **runtime_kwargs):
    """edge.service.loop.run on a Runtime of `cfg` logging to `log`: (its final report, the runtime)."""
    runtime = Runtime(cfg, log=log, **runtime_kwargs)
    return run(runtime, StopFlag()), runtime


def distinct_copy(model, dest_dir, stem):
    """The same network with a different doc string: a 'new model' with another sha256."""
    path = copy_model(model, dest_dir, stem)
    m = onnx.load(path)
    m.doc_string = "re-exported " + stem
    onnx.save(m, path)
    info = json.load(open(path[:-5] + ".json", encoding="utf-8"))
    info["sha256"] = sha256_file(path)  # its own model info (a stale one is refused at load)
    with open(path[:-5] + ".json", "w", encoding="utf-8") as fh:
        json.dump(info, fh)
    return path
