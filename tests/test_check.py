"""`edge check` (scripts/latency_check.py): the real pipeline on a generated 1280x720 video, its JSON report
against the documented schema, the figure's pixel size, the exit codes, --compare, clock state and telemetry."""

import copy
import json
import os
import stat
import subprocess
import sys

import check_schema
import numpy as np
import pytest
import service_helpers as sh

from edge import board
from edge.bench import check, check_report
from edge.bench import report as report_stack
from edge.config import load_config
from edge.infer.latency import STAGES

from conftest import REPO, assert_refused, colour_pixels, run_edge, write_video

SCRIPT = os.path.join(REPO, "scripts", "latency_check.py")
BUDGET_RED = (46, 34, 207)  # BGR of the figure's budget line / FAIL title (#cf222e)
TRACE_PURPLE = (179, 114, 129)  # BGR of the telemetry traces (#8172b3)


def latency_check(*args, timeout=120):
    return subprocess.run([sys.executable, SCRIPT] + [str(a) for a in args], capture_output=True,
                          encoding="utf-8", errors="replace",
                          timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def quiet_ort(tmp_path_factory):
    """No test here is about ORT threading, and no verdict depends on how fast a frame is (budgets of 1000 ms and
    0.1 ms): one ORT thread that does not spin (service_helpers.QUIET_ORT)."""
    return sh.write_config(tmp_path_factory.mktemp("config") / "quiet-ort.yaml", {"backend": sh.QUIET_ORT})


@pytest.fixture(scope="module")
def hd_video(tmp_path_factory):
    path = tmp_path_factory.mktemp("video") / "hd.avi"
    write_video(path, frames=60, size=(1280, 720))
    return str(path)


@pytest.fixture(scope="module")
def passed(small_model, hd_video, quiet_ort, tmp_path_factory):
    """One passing run (generous budget) shared by the tests that read its outputs."""
    out = tmp_path_factory.mktemp("pass")
    proc = latency_check("--config", quiet_ort, "--model", small_model, "--source", hd_video, "--frames", 40,
                         "--warmup", 3, "--budget-ms", 1000, "--json", out / "check.json", "--plot", out / "check.png")
    return proc, out


def test_pass_writes_a_report_matching_the_schema(passed):
    proc, out = passed
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "check.json").read_text(encoding="utf-8"))
    assert check_schema.schema_errors(report) == []
    assert report["schema_version"] == report_stack.SCHEMA_VERSION
    assert report["verdict"] == "pass" and report["budget_ms"] == 1000.0
    assert report["frames"] == 40 and report["warmup"] == 3 and report["ended_by"] == "frames"
    assert (report["backend"], report["precision"]) == ("onnxruntime", "fp32")
    assert set(report["stages_ms"]) == set(STAGES)
    for name in ("capture", "preprocess", "infer", "postprocess", "end_to_end"):  # measured: each takes time
        assert report["stages_ms"][name]["p50"] > 0, name
    e2e = report["stages_ms"]["end_to_end"]
    assert e2e["p50"] >= report["stages_ms"]["infer"]["p50"]  # capture -> result contains the forward pass
    assert report["misses"] == 0 and report["miss_rate"] == 0.0
    assert report["model"]["trained"] is False and "UNTRAINED" in report["model"]["warning"]
    assert len(report["model"]["sha256"]) == 64
    assert report["system"]["jetson"] is False and report["system"]["python"]
    assert board.NOT_A_JETSON in report["warnings"]
    assert report["telemetry"]["status"] in ("ok", "unavailable")
    if report["telemetry"]["status"] == "unavailable":
        assert report["telemetry"]["reason"]
    assert report["figure"] == {"path": str(out / "check.png"), "width_px": 1200, "height_px": 900}
    # the trtexec-like table on stdout, the DVFS warning on stderr
    assert "stage (ms)" in proc.stdout and "end_to_end" in proc.stdout and "PASS" in proc.stdout
    assert board.NOT_A_JETSON in proc.stderr


def test_report_figures_are_those_of_every_timed_frame(small_model, video_file, monkeypatch):
    """p50/p90/p99/max/mean of each stage, computed with numpy from the per-frame times the check recorded: all
    timed frames (a latency window of 8 is widened to the 20 frames), no warm-up frame."""
    kept = []

    class KeptSeries(check_report.SeriesSink):
        def __init__(self, capacity):
            super().__init__(capacity)
            kept.append(self)

    monkeypatch.setattr(check_report, "SeriesSink", KeptSeries)
    cfg = load_config(None, {"model.path": small_model, "source.uri": video_file, "source.fps": 200,
                             "runtime.warmup": 3, "runtime.latency_window": 8, "service.telemetry.enabled": False,
                             **{"backend." + key: value for key, value in sh.QUIET_ORT.items()}})
    report = check.run_check(cfg, check.CheckOptions(frames=20, warmup=3, json="", plot=""), out=lambda line: None,
                             warn=lambda line: None)
    series = kept[0]
    assert report["frames"] == series.count == 20
    for name in STAGES:
        times = series.series(name)
        percentiles = dict(zip(("p50", "p90", "p99"), np.percentile(times, (50, 90, 99))))
        expected = dict(percentiles, max=times.max(), mean=times.mean())
        assert report["stages_ms"][name] == pytest.approx(expected, abs=1e-3), name


def test_schema_check_catches_missing_keys_and_wrong_types(passed):
    report = json.loads((passed[1] / "check.json").read_text(encoding="utf-8"))
    broken = copy.deepcopy(report)
    del broken["miss_rate"]
    broken["frames"] = "40"
    broken["stages_ms"]["infer"]["p99"] = None
    broken["verdict"] = "maybe"
    errors = check_schema.schema_errors(broken)
    assert any("missing 'miss_rate'" in e for e in errors)
    assert any(e.startswith("report.frames:") for e in errors)
    assert any(e.startswith("report.stages_ms.infer.p99:") for e in errors)
    assert any(e.startswith("report.verdict:") for e in errors)


def test_figure_is_a_png_of_the_documented_size(passed):
    cv2 = pytest.importorskip("cv2")
    image = cv2.imread(str(passed[1] / "check.png"))
    assert image is not None, "not a decodable image"
    assert (image.shape[1], image.shape[0]) == report_stack.FIGURE_PX == (1200, 900)
    assert image.std() > 10  # not a blank canvas


def test_over_budget_fails_with_exit_1(small_model, hd_video, quiet_ort, tmp_path):
    cv2 = pytest.importorskip("cv2")
    proc = latency_check("--config", quiet_ort, "--model", small_model, "--source", hd_video, "--frames", 20,
                         "--warmup", 2, "--budget-ms", 0.1, "--json", tmp_path / "r.json", "--plot", tmp_path / "r.png")
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert report["verdict"] == "fail" and "> budget 0.1 ms" in report["verdict_reason"]
    assert report["misses"] == report["frames"] == 20 and report["miss_rate"] == 1.0
    assert "FAIL" in proc.stdout
    image = cv2.imread(str(tmp_path / "r.png"))
    assert colour_pixels(image, BUDGET_RED, tol=12) > 500  # the budget line (on scale here) and the red FAIL title


@pytest.mark.parametrize("case", ["missing model", "source will not open", "bad config"])
def test_cannot_run_exits_2_with_one_line(case, small_model, tmp_path):
    args = {"missing model": ["--model", tmp_path / "nope.onnx", "--source", "synthetic"],
            "source will not open": ["--model", small_model, "--source", tmp_path / "missing.mp4"],
            "bad config": ["--config", tmp_path / "absent.yaml"]}[case]
    proc = latency_check(*args, "--json", tmp_path / "r.json", "--plot", tmp_path / "r.png", "--frames", 5)
    assert assert_refused(proc).startswith("latency_check.py: error: ")
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "r.png").exists()


def test_compare_flags_a_constructed_regression(passed, small_model, hd_video, quiet_ort, tmp_path):
    previous = json.loads((passed[1] / "check.json").read_text(encoding="utf-8"))
    previous["stages_ms"]["infer"].update(p50=0.001, p99=0.001)  # "it used to be instant": infer regressed
    previous["stages_ms"]["preprocess"].update(p50=1000.0, p99=1000.0)  # "it used to be slow": improved
    (tmp_path / "previous.json").write_text(json.dumps(previous), encoding="utf-8")
    proc = latency_check("--config", quiet_ort, "--model", small_model, "--source", hd_video, "--frames", 20,
                         "--warmup", 2, "--budget-ms", 1000, "--json", tmp_path / "r.json", "--plot", "",
                         "--compare", tmp_path / "previous.json", "--fail-on-regression")
    assert proc.returncode == 1, proc.stderr  # within budget, but --fail-on-regression
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert check_schema.schema_errors(report) == []
    assert report["verdict"] == "pass" and report["figure"] is None
    comparison = report["comparison"]
    assert comparison["previous"] == str(tmp_path / "previous.json")
    assert comparison["stages"]["infer"]["p50"]["regressed"] and comparison["stages"]["infer"]["p99"]["regressed"]
    assert not comparison["stages"]["preprocess"]["p50"]["regressed"]
    assert comparison["stages"]["preprocess"]["p99"]["delta_ms"] < 0
    assert any(r.startswith("infer p99 0.001 -> ") for r in comparison["regressions"])
    assert not any(r.startswith("preprocess") for r in comparison["regressions"])
    assert "REGRESSION infer p50" in proc.stdout and "REGRESSION preprocess" not in proc.stdout


def _fake_jetson(root, bin_dir, mode_name, mode_id, pinned):
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nv_tegra_release").write_text(
        "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 2025\n",
        encoding="utf-8")
    (root / "etc" / "nvpmodel.conf").write_text(
        "< POWER_MODEL ID=0 NAME=MAXN >\nCPU_ONLINE CORE_0 1\n< POWER_MODEL ID=1 NAME=15W >\nCPU_ONLINE CORE_0 1\n",
        encoding="utf-8")
    for cpu in ("cpu0", "cpu1"):
        freq = root / "sys/devices/system/cpu" / cpu / "cpufreq"
        freq.mkdir(parents=True)
        (freq / "scaling_min_freq").write_text("2201600\n" if pinned else "115200\n", encoding="utf-8")
        (freq / "scaling_max_freq").write_text("2201600\n", encoding="utf-8")
    gpu = root / "sys/class/devfreq/17000000.ga10b"
    gpu.mkdir(parents=True)
    (gpu / "min_freq").write_text("1300500000\n" if pinned else "306000000\n", encoding="utf-8")
    (gpu / "max_freq").write_text("1300500000\n", encoding="utf-8")
    bin_dir.mkdir()
    nvpmodel = bin_dir / "nvpmodel"
    nvpmodel.write_text("#!/bin/sh\necho 'NV Power Mode: {}'\necho {}\n".format(mode_name, mode_id), encoding="utf-8")
    nvpmodel.chmod(nvpmodel.stat().st_mode | stat.S_IEXEC)


def test_clock_state_warns_when_dvfs_is_free(tmp_path, monkeypatch):
    _fake_jetson(tmp_path / "root", tmp_path / "bin", "15W", 1, pinned=False)
    monkeypatch.setenv("PATH", "{}:{}".format(tmp_path / "bin", os.environ["PATH"]))
    state, warnings = board.clock_state(str(tmp_path / "root"))
    assert state["jetson"] is True and state["l4t"] == "R36.4.3"
    assert state["nvpmodel"] == "15W (1)" and state["nvpmodel_max"] is False
    assert state["jetson_clocks"] == "off"
    assert any(w.startswith("jetson_clocks is off") for w in warnings)
    assert any("not the maximum power mode" in w for w in warnings)


def test_clock_state_quiet_when_pinned_at_maxn(tmp_path, monkeypatch):
    _fake_jetson(tmp_path / "root", tmp_path / "bin", "MAXN", 0, pinned=True)
    monkeypatch.setenv("PATH", "{}:{}".format(tmp_path / "bin", os.environ["PATH"]))
    state, warnings = board.clock_state(str(tmp_path / "root"))
    assert (state["nvpmodel_max"], state["jetson_clocks"], warnings) == (True, "on", [])


def test_clock_state_off_a_jetson(tmp_path):
    state, warnings = board.clock_state(str(tmp_path))
    assert state["jetson"] is False and state["jetson_clocks"] == "unknown"
    assert warnings == [board.NOT_A_JETSON]


class FakeTelemetry:
    """Stands in for edge.service.telemetry.Telemetry: a rising temperature, a fixed GPU clock, a power reading."""

    def __init__(self, interval_s=1.0, log=None, **_):
        self.n = 0

    def wants_jtop(self):
        return False

    def start(self):
        return self

    def latest(self):
        from edge.service.telemetry import TelemetrySnapshot

        self.n += 1
        return TelemetrySnapshot(time=float(self.n), source="fake", temperatures={"cpu": 40.0 + self.n, "gpu": 30.0},
                                 gpu_freq_mhz=918.0, power_w=5.0 + 0.1 * (self.n % 3))

    def stop(self):
        pass


def test_telemetry_summary_and_traces(small_model, video_file, tmp_path, monkeypatch):
    cv2 = pytest.importorskip("cv2")
    import edge.service.telemetry

    monkeypatch.setattr(edge.service.telemetry, "Telemetry", FakeTelemetry)
    cfg = load_config(None, {"model.path": small_model, "source.uri": video_file, "source.fps": 200,
                             "backend.intra_op_spinning": False})
    lines = []
    options = check.CheckOptions(frames=12, warmup=2, json=str(tmp_path / "r.json"), plot=str(tmp_path / "r.png"))
    report = check.run_check(cfg, options, out=lines.append, warn=lines.append)
    tele = report["telemetry"]
    assert tele["status"] == "ok" and tele["reason"] is None and tele["samples"] >= 12
    assert tele["gpu_clock_mhz"] == {"min": 918.0, "mean": 918.0, "max": 918.0}
    assert tele["temperature_c"]["min"] > 40.0 and tele["temperature_c"]["max"] > tele["temperature_c"]["min"]
    assert 5.0 <= tele["power_w"]["min"] <= tele["power_w"]["mean"] <= tele["power_w"]["max"] <= 5.2
    assert check_schema.schema_errors(report) == []
    assert "telemetry min/mean/max: temperature_c" in lines[-1]
    image = cv2.imread(str(tmp_path / "r.png"))
    bottom = image[int(image.shape[0] * 0.7):]  # the three telemetry panels
    assert colour_pixels(bottom, TRACE_PURPLE, tol=20) > 300


def test_edge_check_is_registered():
    proc = run_edge("check", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--compare" in proc.stdout and "--budget-ms" in proc.stdout
