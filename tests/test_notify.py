"""sd_notify: READY/STATUS/WATCHDOG over a real AF_UNIX datagram socket, from edge.service.notify and
`edge run`."""

import os
import subprocess
import sys
import threading
import time

import pytest
import service_helpers as sh

from edge.infer.pipeline import Sink
from edge.infer.stages import create_stages
from edge.service.notify import Notifier
from edge.service.runtime import Runtime
from edge.sources.capture import SyntheticCapture

from conftest import REPO


@pytest.fixture
def listener(tmp_path, monkeypatch):
    lst = sh.NotifyListener(tmp_path)
    monkeypatch.setenv("NOTIFY_SOCKET", lst.address)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield lst
    lst.close()


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_notifier_reaches_path_and_abstract_sockets(tmp_path, monkeypatch, abstract):
    lst = sh.NotifyListener(tmp_path, abstract=abstract)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", lst.address)
        n = Notifier()
        assert n.enabled
        assert n.ready("fps 30") and n.status("line one\nline two")
        lst.wait_for("STATUS", after=0)
        assert sh.wait_until(lambda: len(lst.lines("STATUS")) == 2, 30)
    finally:
        lst.close()
    assert [line for _, line in lst.fields()] == ["READY=1", "STATUS=fps 30", "STATUS=line one line two"]
    assert n.sent == 2 and n.errors == 0


def test_watchdog_needs_ready_and_pings_at_most_every_half_interval(listener, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # WatchdogSec=0.4 s -> ping at most every 0.2 s
    n = Notifier()
    assert n.watchdog_interval_s == pytest.approx(0.2)
    assert not n.watchdog(now=100.0), "no ping before READY=1"
    n.ready()
    sent = [n.watchdog(now=t) for t in (n.last_watchdog + 0.05, n.last_watchdog + 0.21, n.last_watchdog + 0.3,
                                        n.last_watchdog + 0.45)]
    assert sent == [False, True, False, True]
    assert sh.wait_until(lambda: len(listener.lines("WATCHDOG")) == 3, 30)  # READY=1's own ping, then these two


def test_watchdog_for_another_pid_is_ignored(listener, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    monkeypatch.setenv("WATCHDOG_PID", "1")
    n = Notifier()
    n.ready()
    assert n.watchdog_interval_s is None and not n.watchdog(now=time.monotonic() + 10)


def test_send_failures_are_counted_and_logged_not_swallowed(tmp_path, monkeypatch):
    lst = sh.NotifyListener(tmp_path)
    monkeypatch.setenv("NOTIFY_SOCKET", lst.address)
    logged = []
    n = Notifier(log=lambda event, **fields: logged.append((event, fields)))
    lst.close()  # systemd went away: the datagram is refused
    assert not n.send("STATUS=x")
    assert n.errors == 1 and logged and logged[0][0] == "notify_error"
    assert "ConnectionRefusedError" in logged[0][1]["error"] or "FileNotFoundError" in logged[0][1]["error"]


def test_no_notify_socket_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = Notifier()
    assert not n.enabled and not n.ready() and not n.send("STATUS=x") and n.errors == 0


def test_edge_run_notifies_ready_status_watchdog_and_stopping(small_model, tmp_path):
    lst = sh.NotifyListener(tmp_path)
    try:
        env = dict(os.environ, NOTIFY_SOCKET=lst.address, WATCHDOG_USEC="200000")
        env.pop("WATCHDOG_PID", None)
        cfg = sh.write_config(tmp_path / "cfg.yaml", {
            "source": {"uri": "synthetic", "width": 96, "height": 72, "fps": 60},
            "runtime": {"warmup": 2, "budget_ms": 1000}, "service": {"telemetry": {"enabled": False}}})
        proc = subprocess.run([sys.executable, "-m", "edge", "run", "--config", cfg, "--model", small_model,
                               "--backend", "onnxruntime", "--preprocess", "cpu", "--frames", "90"],
                              cwd=REPO, env=env, capture_output=True, encoding="utf-8", errors="replace", timeout=300)
        assert sh.wait_until(lambda: lst.lines("STOPPING"), 30)  # the last datagram has arrived
    finally:
        lst.close()
    assert proc.returncode == 0, proc.stderr
    fields = [line for _, line in lst.fields()]
    assert fields[:2] == ["READY=1", "WATCHDOG=1"] and fields[2].startswith("STATUS=fps ")
    assert "p99" in fields[2] and "misses 0" in fields[2]
    pings = [f for f in fields if f == "WATCHDOG=1"]
    assert len(pings) >= 3, fields  # ~1.5 s of frames, a ping every >= 0.1 s
    ping_times = [t for t, line in lst.fields() if line == "WATCHDOG=1"]
    # rate limit: no more pings than one per WATCHDOG_USEC/2 over the span (arrival times jitter a little;
    # the exact rule is test_watchdog_needs_ready_and_pings_at_most_every_half_interval's)
    assert len(ping_times) <= (ping_times[-1] - ping_times[0]) / 0.1 + 1.5, "pinged faster than WATCHDOG_USEC/2"
    assert fields[-2] == "STOPPING=1" and fields[-1].startswith("STATUS=stopping (frames): 90 frames")
    start = sh.json_lines(proc.stdout)[0]
    assert start["systemd"] is True and start["watchdog_ping_s"] == pytest.approx(0.1)


def test_watchdog_stops_while_inference_hangs_and_resumes_after(small_model, listener, monkeypatch):
    """The runtime in a thread with a backend whose infer() blocks: READY arrives, then no WATCHDOG=1 while
    the call hangs (systemd would kill and restart us), and pings resume when it returns."""
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    backend = sh.ControlledBackend(small_model)
    cfg = sh.service_config(small_model)
    log = sh.ListLog()
    runtime = Runtime(cfg, log=log, stages_factory=sh.stages_with(backend))
    stop, thread, outcome = sh.run_in_thread(runtime)
    try:
        ready_at, _ = listener.wait_for("READY")
        first_ping, _ = listener.wait_for("WATCHDOG", after=ready_at)
        assert first_ping >= ready_at
        backend.hang.set()
        assert backend.hanging.wait(5), "the backend never hung"
        hang_started = time.monotonic()
        time.sleep(1.0)  # five ping intervals
        during = [t for t, _ in listener.lines("WATCHDOG") if t > hang_started + 0.05]
        assert during == [], "watchdog pinged while inference hung"
        backend.release.set()
        resumed, _ = listener.wait_for("WATCHDOG", after=hang_started + 1.0, timeout=5)
        assert resumed > hang_started + 1.0
    finally:
        backend.release.set()
        stop.request("test over")
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert outcome["report"]["ended_by"] == "test over" and outcome["report"]["frames"] > 0
    assert sh.wait_until(lambda: listener.lines("STOPPING"), 30)


def test_ready_carries_a_watchdog_ping(listener, monkeypatch):
    """systemd counts only WATCHDOG=1 as a ping: the READY=1 that ends a start or a reload carries one, in the same
    datagram, since the next ping is paced from it."""
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    n = Notifier()
    assert n.ready("reloaded")
    assert sh.wait_until(lambda: listener.messages, 30)
    assert listener.messages[0][1].split("\n") == ["READY=1", "WATCHDOG=1", "STATUS=reloaded"]
    monkeypatch.delenv("WATCHDOG_USEC")
    assert Notifier().ready() and sh.wait_until(lambda: len(listener.messages) == 2, 30)
    assert listener.messages[1][1] == "READY=1"  # no watchdog, no ping


class Served(Sink):
    """Counts delivered results and names the model that served each."""

    def __init__(self, runtime_holder):
        self.runtime_holder = runtime_holder
        self.models = []

    def on_result(self, result):
        self.models.append(self.runtime_holder[0].stages.model_path)


def runtime_in_thread(cfg, stages_factory=None, reload_config=None):
    holder = []
    served = Served(holder)
    runtime = Runtime(cfg, sinks=[served], log=sh.ListLog(), stages_factory=stages_factory,
                      reload_config=reload_config)
    holder.append(runtime)
    return (runtime, served) + sh.run_in_thread(runtime)


def test_reloads_in_a_row_never_starve_the_watchdog(small_model, listener, monkeypatch):
    """The rehearsal's watchdog kill: reloads a few seconds apart used to push the ping pacing on without a ping
    (READY=1 was taken for one) until WatchdogSec ran out. Reloads back to back, at least 5 of them and for 10 s,
    WatchdogSec=4 s: no gap between two pings reaches it (before: no ping at all while they went on)."""
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    runtime, _, stop, thread, outcome = runtime_in_thread(sh.service_config(small_model))
    try:
        ready_at, _ = listener.wait_for("READY")
        while time.monotonic() - ready_at < 10.0 or len(runtime.log.events("reload")) < 5:
            done = len(runtime.log.events("reload"))
            stop.reload.set()
            assert sh.wait_until(lambda done=done: len(runtime.log.events("reload")) > done or not thread.is_alive(),
                                 60)
        ended = time.monotonic()
    finally:
        stop.request("test over")
        thread.join(timeout=60)
    pings = [t for t, _ in listener.lines("WATCHDOG") if ready_at <= t <= ended]
    assert outcome["report"]["reloads"]["failed"] == 0
    times = [ready_at] + pings + [ended]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 4.0, gaps


def test_a_load_that_outlasts_the_watchdog_keeps_the_old_model_serving(small_model, tmp_path, listener,
                                                                        monkeypatch):
    """A reload whose load takes longer than WatchdogSec (a TensorRT engine's can): the new model loads beside the
    old one, which serves every frame and keeps the watchdog pinged until the new one is proven and swapped in."""
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    new_model = sh.copy_model(small_model, tmp_path, "new")
    loading, release = threading.Event(), threading.Event()

    def factory(cfg):
        if cfg.model.path == new_model:
            loading.set()
            release.wait(60)
        return create_stages(cfg)

    runtime, served, stop, thread, outcome = runtime_in_thread(
        sh.service_config(small_model), stages_factory=factory,
        reload_config=lambda: sh.service_config(new_model))
    try:
        ready_at, _ = listener.wait_for("READY")
        stop.reload.set()
        assert loading.wait(60), "the reload never started loading"
        load_began, before = time.monotonic(), len(served.models)
        # three pings after the load began span more than WatchdogSec (0.4 s): the old model kept serving
        assert sh.wait_until(lambda: len([t for t, _ in listener.lines("WATCHDOG") if t > load_began]) >= 3, 30)
        assert len(served.models) > before and set(served.models[before:]) == {small_model}
        assert runtime.reloads == {"ok": 0, "failed": 0}  # not swapped before the new model is proven
        release.set()
        assert sh.wait_until(lambda: runtime.log.events("reload"), 60)
        assert sh.wait_until(lambda: served.models[-1] == new_model, 30)
    finally:
        release.set()
        stop.request("test over")
        thread.join(timeout=60)
    reload_event = runtime.log.events("reload")[0]
    assert reload_event["model"] == new_model and reload_event["took_ms"] >= 400
    assert outcome["report"]["reloads"] == {"ok": 1, "failed": 0}


class LateCamera(SyntheticCapture):
    """A camera that is not there yet (opening fails) until `present` is set: nvargus-daemon or a USB camera that
    comes up after the service at boot."""

    def __init__(self, present):
        super().__init__(64, 48, 100.0, variants=2)
        self.description = "late camera"
        self.present = present

    def open(self):
        if not self.present.is_set():
            raise IOError("no camera yet")
        super().open()


def test_under_systemd_a_camera_absent_at_start_is_waited_for_not_fatal(small_model, listener):
    """Under systemd a source silent past source.start_timeout_s is no exit 2 (which restarted the service into its
    start limit, and `failed`): READY=1 says degraded, the source is retried with backoff, the watchdog pinged, and
    frames flow once the camera appears. Without systemd it stays a one-line error (tests/test_dead_source.py)."""
    present = threading.Event()
    cfg = sh.service_config(small_model, **{"source.start_timeout_s": 0.5, "source.timeout_s": 0.2})
    runtime = Runtime(cfg, log=sh.ListLog(), capture_factory=lambda _: LateCamera(present))
    stop, thread, outcome = sh.run_in_thread(runtime)
    try:
        ready_at, _ = listener.wait_for("READY")
        assert sh.wait_until(lambda: runtime.log.events("source_start_timeout"), 30)
        waited = runtime.log.events("source_start_timeout")[0]
        assert waited["error"].startswith("late camera: no frame within 0.5 s of start (last fault: ")
        status = [line for t, line in listener.lines("STATUS") if t >= ready_at][0]
        assert status.startswith("STATUS=degraded: late camera: no frame within 0.5 s of start")
        assert sh.wait_until(lambda: len(runtime.log.events("source_reconnect_failed")) >= 2, 30)
        assert thread.is_alive() and runtime.pipeline.recorder.frames == 0
        present.set()
        assert sh.wait_until(lambda: runtime.log.events("source_recovered"), 30)
        assert sh.wait_until(lambda: runtime.pipeline.recorder.frames >= 5, 30)
    finally:
        present.set()
        stop.request("test over")
        thread.join(timeout=60)
    assert outcome["report"]["ended_by"] == "test over" and outcome["report"]["frames"] >= 5
    assert len(listener.lines("READY")) == 1
