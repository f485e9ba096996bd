"""Several cameras on one engine (config `sources`): `edge run` serves three synthetic cameras from one ONNX Runtime
model with a batch axis, per-camera figures in the report, the JSON lines and the metrics; a camera that dies
mid-run costs the others nothing; one camera, or `batching.policy: off`, is batch 1."""

import io
import json
import urllib.request

import pytest
from service_helpers import free_port, json_lines, write_config

from edge.config import MAX_CAMERAS, load_config
from edge.service.log import JsonLog
from edge.service.loop import run
from edge.service.runtime import Runtime
from edge.service.signals import StopFlag
from edge.sources.capture import SyntheticCapture
from edge.sources.source import open_capture

from conftest import assert_refused, edge_here, run_edge

NAMES = ("front", "left", "right")
LOOSE_BUDGET_MS = 5000.0  # nothing expires on a loaded machine: what is served is decided by the batcher, not luck


def cameras_config(tmp_path, model, **sections):
    """tmp_path/cameras.yaml: the three cameras NAMES on `model`; each of `sections` replaces that top-level value,
    or, a dict, is merged into that section."""
    data = {"model": {"path": model}, "source": {"width": 320, "height": 240},
            "sources": [{"name": n} for n in NAMES],
            "runtime": {"budget_ms": LOOSE_BUDGET_MS, "warmup": 3}, "service": {"telemetry": {"enabled": False}}}
    for key, value in sections.items():
        data[key] = value if not isinstance(value, dict) else dict(data.get(key, {}), **value)
    return write_config(tmp_path / "cameras.yaml", data)


def test_edge_run_serves_three_cameras_from_one_model(tmp_path, dynamic_model):
    config = cameras_config(tmp_path, dynamic_model, runtime={"report_every": 20})
    proc = run_edge("run", "--config", config, "--frames", 90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = json_lines(proc.stdout)
    start = next(e for e in lines if e["event"] == "start")
    assert start["cameras"] == list(NAMES) and start["max_batch"] == 3
    report = lines[-1]
    assert report["event"] == "report" and report["frames"] == 90
    assert set(report["cameras"]) == set(NAMES)
    assert sum(c["frames"] for c in report["cameras"].values()) == 90
    for name in NAMES:
        camera = report["cameras"][name]
        assert camera["frames"] > 0 and camera["stages_ms"]["end_to_end"]["p99"] > 0
        assert camera["misses"] == 0 and camera["expired"] == 0
    summary = next(e for e in lines if e["event"] == "summary")  # the periodic JSON line has them too
    assert set(summary["cameras"]) == set(NAMES)
    for name in NAMES:  # the table on stderr: a row per camera
        assert any(line.split()[:1] == [name] for line in proc.stderr.splitlines()), proc.stderr


class Unplugged(SyntheticCapture):
    """A synthetic camera that is unplugged after `frames` reads: reads fail and it cannot be opened again."""

    def __init__(self, cfg, frames):
        super().__init__(cfg.width, cfg.height, cfg.fps, variants=2)
        self.left = frames

    def open(self):
        if self.left <= 0:
            raise OSError("no such device")
        super().open()

    def read(self):
        self.left -= 1
        if self.left < 0:
            raise OSError("device gone")
        return super().read()


class Collect:
    def __init__(self):
        self.results = []

    def on_result(self, result):
        self.results.append((result.camera, result.batch, result.status))

    def close(self):
        pass


def run_cameras(config, factory=open_capture, frames=120, overrides=None):
    cfg = load_config(config, dict({"runtime.frames": frames}, **(overrides or {})))
    sink = Collect()
    runtime = Runtime(cfg, [sink], JsonLog(stream=io.StringIO()), capture_factory=factory)
    return run(runtime, StopFlag()), sink.results, runtime


def test_a_camera_unplugged_mid_run_costs_the_others_nothing(tmp_path, dynamic_model):
    config = cameras_config(tmp_path, dynamic_model, service={"reconnect_initial_s": 0.05, "reconnect_max_s": 0.1})
    dies = {}

    def factory(cfg):
        if cfg.name != "left":
            return open_capture(cfg)
        capture = dies.get("left") or Unplugged(cfg, 15)
        dies["left"] = capture
        return capture

    report, results, _ = run_cameras(config, factory, frames=150)
    left = [i for i, (camera, _, _) in enumerate(results) if camera == "left"]
    assert 0 < len(left) <= 15
    after = results[left[-1] + 1:]
    for name in ("front", "right"):  # served on after it died, every frame on time
        assert sum(camera == name for camera, _, _ in after) >= 40
    assert all(status == "ok" for _, _, status in results)
    assert report["cameras"]["left"]["faults"] >= 1 and report["ended_by"] == "frames"


def test_batching_off_and_a_batch_one_model_serve_one_frame_at_a_time(tmp_path, dynamic_model, tiny_classifiers):
    config = cameras_config(tmp_path, dynamic_model, runtime={"batching": {"policy": "off"}})
    report, results, runtime = run_cameras(config, frames=60)
    assert {batch for _, batch, _ in results} == {1} and runtime.facts["max_batch"] == 1
    assert set(report["batches"]) == {"1"}
    config = cameras_config(tmp_path, tiny_classifiers[0])  # static 1x3xHxW: batch 1 whatever the config says
    report, results, runtime = run_cameras(config, frames=60)
    assert {batch for _, batch, _ in results} == {1} and runtime.facts["max_batch"] == 1
    assert {camera for camera, _, _ in results} == set(NAMES)


def test_one_camera_in_sources_is_the_batch_one_path(tmp_path, dynamic_model):
    config = cameras_config(tmp_path, dynamic_model, sources=[{"name": "only", "fps": 60.0}])
    report, results, runtime = run_cameras(config, frames=30)
    assert "cameras" not in report and "max_batch" not in runtime.facts
    assert {(camera, batch) for camera, batch, _ in results} == {("", 1)}
    assert "60" in runtime.facts["source"]  # the camera's own keys


def test_metrics_have_a_camera_label_per_configured_camera(tmp_path, dynamic_model):
    config = cameras_config(tmp_path, dynamic_model)
    scraped = {}

    class Scrape(Collect):
        def on_result(self, result):
            if result.frames == 60 and not scraped:
                url = "http://127.0.0.1:{}/metrics".format(runtime.metrics_port)
                scraped["text"] = urllib.request.urlopen(url, timeout=10).read().decode()

    cfg = load_config(config, {"runtime.frames": 80, "service.metrics.enabled": True,
                               "service.metrics.port": free_port()})
    runtime = Runtime(cfg, [Scrape()], JsonLog(stream=io.StringIO()))
    run(runtime)
    text = scraped["text"]
    labelled = {line.split('camera="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("edge_camera_") and 'camera="' in line}
    assert labelled == set(NAMES)
    assert 'edge_camera_dropped_frames_total{camera="front",reason="expired"}' in text
    count = next(line for line in text.splitlines() if line.startswith("edge_frame_batch_size_count"))
    assert float(count.split()[1]) >= 59  # every frame before this one (the metrics sink sees it after ours)


@pytest.mark.parametrize("sources, names", [
    ([{"name": "a"}, {"name": "a"}], ["sources[1].name", "a"]),
    ([{"uri": "synthetic"}], ["sources[0].name"]),
    ([{"name": "a b"}], ["sources[0].name"]),
    ([{"name": "a", "fps": 0}], ["sources[0].fps"]),
    ([{"name": "c{}".format(i)} for i in range(MAX_CAMERAS + 1)], ["sources", str(MAX_CAMERAS)]),
])
def test_bad_cameras_are_refused_in_one_line(tmp_path, sources, names):
    path = write_config(tmp_path / "bad.yaml", {"sources": sources})
    assert_refused(edge_here("run", "--config", path), str(path), *names)


def test_cameras_take_the_source_section_for_what_they_leave_out(tmp_path):
    path = write_config(tmp_path / "c.yaml", {"source": {"fps": 12.5, "width": 640},
                                              "sources": [{"name": "a"}, {"name": "b", "fps": 25.0}]})
    a, b = load_config(path).sources
    assert (a.fps, a.width, b.fps, b.width) == (12.5, 640, 25.0, 640)


def test_the_latency_check_judges_every_camera(tmp_path, dynamic_model):
    from edge.bench.check import CheckOptions, run_check

    printed = []
    config = cameras_config(tmp_path, dynamic_model)
    report = run_check(load_config(config), CheckOptions(frames=60, warmup=3, json=str(tmp_path / "check.json"),
                                                         plot=""), out=printed.append, warn=lambda line: None)
    assert set(report["cameras"]) == set(NAMES) and report["verdict"] == "pass"
    assert "worst camera" in report["verdict_reason"]
    assert sum(c["frames"] for c in report["cameras"].values()) == 60
    assert all(any(line.split()[:1] == [name] for line in printed[0].splitlines()) for name in NAMES)
    saved = json.loads((tmp_path / "check.json").read_text(encoding="utf-8"))
    assert set(saved["cameras"]) == set(NAMES)
    tight = load_config(config, {"runtime.budget_ms": 0.001})  # no camera meets this budget: the check fails
    quick = CheckOptions(frames=30, warmup=3, json="", plot="")
    assert run_check(tight, quick, out=printed.append, warn=lambda line: None)["verdict"] == "fail"


def test_the_demo_shows_a_tile_per_camera(tmp_path, dynamic_model):
    from edge.service.demo_stream import OverlaySink

    sink = OverlaySink(LOOSE_BUDGET_MS, trained=False)
    cfg = load_config(cameras_config(tmp_path, dynamic_model), {"runtime.frames": 30})
    run(Runtime(cfg, [sink], JsonLog(stream=io.StringIO())))
    assert set(sink.tiles) == set(NAMES)
    assert sink.last.shape == (240, 320, 3)  # one camera's size: the stream costs what one camera's did
    top_left, bottom_right = sink.last[:120, :160], sink.last[120:, 160:]
    assert top_left.std() > 0 and not bottom_right.any()  # three tiles of a 2x2 grid, the fourth empty


def test_a_reload_to_a_batch_one_model_serves_one_frame_at_a_time(tmp_path, dynamic_model, tiny_classifiers):
    wait = {"batching": {"max_wait_ms": 40.0}}  # longer than a frame period: every camera's next frame is waited for
    cfg = load_config(cameras_config(tmp_path, dynamic_model, runtime=wait), {"runtime.frames": 0})
    swapped = load_config(cameras_config(tmp_path, tiny_classifiers[0], runtime=wait), {"runtime.frames": 0})
    stop = StopFlag()
    served = ServedBy(stop, reload_at=60, stop_after=30)
    runtime = Runtime(cfg, [served], JsonLog(stream=io.StringIO()), reload_config=lambda: swapped)
    report = run(runtime, stop)
    assert runtime.reloads == {"ok": 1, "failed": 0} and report["errors"] == 0
    # the model loads beside the serving one: the swap lands some frames after the request, between two batches
    before, after = served.batches[0], served.batches[1]
    assert max(before) > 1 and len(after) >= 30  # the premise: batches before the swap
    assert set(after) == {1} and runtime.source.batcher.max_batch == 1


class ServedBy(Collect):
    """Each frame's batch size, by how many reloads had landed when it was served; asks for the reload at frame
    `reload_at` and stops `stop_after` frames after the swap."""

    def __init__(self, stop, *, reload_at, stop_after):
        super().__init__()
        self.stop, self.reload_at, self.stop_after = stop, reload_at, stop_after
        self.batches = {0: [], 1: []}

    def on_result(self, result):
        after = self.batches[result.reloads.get("ok", 0)]
        after.append(result.batch)
        if result.frames == self.reload_at:
            self.stop.reload.set()
        if result.reloads.get("ok") and len(after) >= self.stop_after:
            self.stop.request("test done")


def test_batching_off_is_written_as_yaml_people_write_it(tmp_path):
    path = tmp_path / "off.yaml"
    path.write_text("runtime:\n  batching:\n    policy: off\n",
                    encoding="utf-8")  # YAML 1.1 reads an unquoted off as false
    assert load_config(str(path)).runtime.batching.policy == "off"
    path.write_text("runtime:\n  batching:\n    policy: yes\n", encoding="utf-8")
    assert_refused(edge_here("run", "--config", path), "runtime.batching.policy")
