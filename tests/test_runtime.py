"""edge.service.runtime: a stop is served while the source is down, a reload swaps the stages in process (and keeps
the old ones when the new fail), and the report stays the last line whatever a thread says after it."""

import threading
import time

import service_helpers as sh

from edge.service.runtime import Runtime
from edge.service.signals import StopFlag


def stalled_for(runtime):
    busy = runtime.source.cameras[0].reader.view().busy_since
    return time.monotonic() - busy if busy is not None else 0.0


def test_stop_is_served_quickly_while_the_source_is_down(small_model):
    sh.HangingCapture.instances = []
    cfg = sh.service_config(small_model, **{"source.timeout_s": 120.0})
    runtime = Runtime(cfg, log=sh.ListLog(), capture_factory=lambda source: sh.HangingCapture(good=20))
    stop, thread, out = sh.run_in_thread(runtime)
    try:
        assert sh.wait_until(lambda: runtime.source is not None and stalled_for(runtime) > 0.3, 60)
        stop.request("test stop")
        thread.join(timeout=60)  # served within a slice of the wait, not after source.timeout_s (120 s)
        assert not thread.is_alive()
    finally:
        sh.HangingCapture.instances[0].release.set()
        stop.request("cleanup")
        thread.join(timeout=5)
    assert out["report"]["ended_by"] == "test stop" and out["report"]["source_timeouts"] == 0


def test_the_report_stays_the_last_line_whatever_a_thread_says_after_it(small_model):
    """The telemetry and source threads can still speak while the runtime closes (a jtop connection that fails
    as the service stops): the report stays the last line."""
    log = sh.ListLog()
    report, runtime = sh.run_in_process(sh.service_config(small_model, **{"runtime.frames": 3}), log)
    late = threading.Thread(target=runtime.event, args=("telemetry_degraded",),
                            kwargs={"level": "warning", "reason": "jtop: said late"})
    late.start()
    late.join()
    assert report["frames"] == 3 and log.records[-1]["event"] == "report"
    assert not log.events("telemetry_degraded")


def test_reload_in_process_swaps_the_backend_object(small_model, tmp_path):
    b = sh.distinct_copy(small_model, tmp_path, "b")
    configs = iter([sh.service_config(b), sh.service_config(str(tmp_path / "missing.onnx"))])
    with Runtime(sh.service_config(small_model), log=sh.ListLog(), reload_config=lambda: next(configs)) as rt:
        frames = rt.frames(StopFlag())
        rt.process(next(frames))
        old = rt.stages.backend
        assert rt.reload()
        assert rt.stages.backend is not old and old.session is None  # the old one was closed
        assert [r.status in ("ok", "miss") for r in rt.process(next(frames))] == [True]  # one camera: a batch of one
        assert not rt.reload()
        assert rt.stages.model_path == b and rt.reloads == {"ok": 1, "failed": 1}
