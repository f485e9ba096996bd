"""Telemetry: jtop key mapping, the Linux reader, degraded paths, and jetson-stats' real service in testing mode."""

import functools
import gc
import importlib
import json
import os
import threading
import time

import pytest
import service_helpers as sh
import service_jtop as sj
from prometheus_client import generate_latest

from edge.service.metrics import MetricsSink
from edge.service.telemetry import LinuxReader, Telemetry, TelemetrySnapshot, snapshot_from_jtop

from conftest import as_nobody

XAVIER_STATS = {
    "time": None, "uptime": None, "CPU1": 12, "CPU2": 30, "CPU3": "OFF", "RAM": 0.41, "SWAP": 0.0, "EMC": 7,
    "GPU": 55.0, "NVENC": "OFF", "Fan pwmfan0": 30.0, "Temp CPU": 48.5, "Temp GPU": 46.0, "Temp PMIC": -256,
    "Power VDD_CPU_GPU_CV": 4200, "Power TOT": 9850, "jetson_clocks": "ON", "nvp model": "MODE_15W",
}
XAVIER_CPU = {"cpu": [{"online": True, "freq": {"cur": 1190400}}, {"online": True, "freq": {"cur": 1420800}},
                      {"online": False, "freq": {"cur": 0}}]}
XAVIER_GPU = {"gpu": {"status": {"load": 55.0}, "freq": {"cur": 1109250, "min": 114750, "max": 1377000}}}
XAVIER_MEMORY = {"RAM": {"tot": 16000000, "used": 6560000}, "EMC": {"cur": 2133000, "val": 7}}


def test_full_stats_map_to_base_units():
    snap = snapshot_from_jtop(XAVIER_STATS, XAVIER_CPU, XAVIER_GPU, XAVIER_MEMORY, now=1.0)
    assert snap.source == "jtop" and snap.degraded is None
    assert snap.gpu_load == pytest.approx(0.55)  # % -> ratio
    assert snap.cpu_load == pytest.approx(0.21)  # mean of online cores, OFF skipped
    assert snap.cpu_freq_mhz == pytest.approx((1190.4 + 1420.8) / 2)  # kHz -> MHz, offline core skipped
    assert snap.gpu_freq_mhz == pytest.approx(1109.25) and snap.emc_freq_mhz == pytest.approx(2133.0)
    assert snap.temperatures == {"CPU": 48.5, "GPU": 46.0}  # the -256 (offline) sensor dropped
    assert snap.power_w == pytest.approx(9.85)  # mW -> W
    assert snap.ram_fraction == 0.41  # already a fraction in stats
    assert snap.nvpmodel == "MODE_15W" and snap.jetson_clocks is True


def test_orin_and_thor_like_stats_missing_keys_stay_none():
    # Orin: no EMC in memory, nvpmodel None (no 'nvp model'), no power rails; Thor-like odd GPU structure
    stats = {"CPU1": 5, "RAM": 0.1, "Temp tj": 51.0}
    snap = snapshot_from_jtop(stats, {"cpu": [{"online": True}]}, {"gpu": {"status": {}}}, {"RAM": {}})
    assert snap.gpu_load is None and snap.power_w is None and snap.emc_freq_mhz is None
    assert snap.cpu_freq_mhz is None and snap.gpu_freq_mhz is None  # Orin issue #556: no 'freq'
    assert snap.nvpmodel is None and snap.jetson_clocks is None
    assert snap.temperatures == {"tj": 51.0} and snap.ram_fraction == 0.1
    assert snapshot_from_jtop({}).temperatures == {}
    # the docstring's spelling is accepted too, and GPU load falls back to the structured attribute
    snap = snapshot_from_jtop({"nvpmodel": "MAXN", "jetson_clocks": "OFF"}, gpu={"ga10b": {"status": {"load": 12.5}}})
    assert snap.nvpmodel == "MAXN" and snap.jetson_clocks is False and snap.gpu_load == pytest.approx(0.125)


def test_brief_is_compact_and_json_ready():
    snap = snapshot_from_jtop(XAVIER_STATS, XAVIER_CPU, XAVIER_GPU, XAVIER_MEMORY)
    brief = json.loads(json.dumps(snap.brief()))
    assert brief["temp_max_c"] == 48.5 and brief["gpu_freq_mhz"] == 1109.2 and brief["nvpmodel"] == "MODE_15W"
    assert "degraded" not in brief and "power_w" in brief


def test_linux_reader_reads_thermal_zones_ram_and_a_devfreq_gpu(tmp_path):
    for n, (kind, milli) in enumerate((("cpu-thermal", "45500"), ("cpu-thermal", "47000"), ("bad", "x"))):
        zone = tmp_path / "thermal" / "thermal_zone{}".format(n)
        zone.mkdir(parents=True)
        (zone / "type").write_text(kind + "\n", encoding="utf-8")
        (zone / "temp").write_text(milli + "\n", encoding="utf-8")
    gpu = tmp_path / "devfreq" / "17000000.gpu"
    (gpu / "device" / "of_node").mkdir(parents=True)
    (gpu / "device" / "of_node" / "name").write_text("gpu", encoding="utf-8")
    (gpu / "cur_freq").write_text("306000000", encoding="utf-8")
    (gpu / "device" / "load").write_text("125", encoding="utf-8")
    snap = LinuxReader(str(tmp_path / "thermal"), str(tmp_path / "devfreq")).read()
    assert snap.source == "linux" and snap.degraded is None
    assert snap.temperatures == {"cpu-thermal": 45.5, "cpu-thermal.1": 47.0}
    assert snap.gpu_freq_mhz == pytest.approx(306.0) and snap.gpu_load == pytest.approx(0.125)
    assert 0 < snap.ram_fraction < 1


def test_linux_reader_without_psutil_uses_proc_meminfo(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal:  1000 kB\nMemFree: 100 kB\nMemAvailable:  250 kB\n", encoding="utf-8")
    reader = LinuxReader(str(tmp_path), str(tmp_path), str(tmp_path / "meminfo"))
    reader._psutil = None
    snap = reader.read()
    assert snap.ram_fraction == pytest.approx(0.75) and snap.cpu_load is None


def test_no_jtop_service_is_degraded_retried_with_backoff_and_never_fatal(tmp_path, no_jtop_service):
    stale = tmp_path / "jtop.sock"  # a socket file left behind by a service that is not running
    stale.write_bytes(b"")
    logged = []
    telemetry = Telemetry(0.05, retry_initial_s=0.05, retry_max_s=0.2, socket_path=str(stale),
                          log=lambda event, **f: logged.append((event, f)))
    assert telemetry.wants_jtop()
    started = time.monotonic()
    telemetry.start()
    try:
        assert sh.wait_until(lambda: telemetry.latest().source != "none", 30), telemetry.latest()
        first = telemetry.latest()  # the first sample already says why jtop is not read: no healthy-looking gap
        assert sh.wait_until(lambda: len(telemetry.retry_delays) >= 3, 60), telemetry.attempts  # 3 failed attempts
        elapsed = time.monotonic() - started
        snap = telemetry.latest()
    finally:
        telemetry.stop()
    assert first.source == "linux" and str(first.degraded).startswith("jtop: "), first
    assert snap.source == "linux" and snap.degraded == first.degraded and "not active" in snap.degraded  # jtop's own
    assert snap.ram_fraction is not None  # the Linux reader filled in meanwhile
    delays = telemetry.retry_delays
    # backoff (0.05, 0.1, then every 0.2 s), not a retry on every 50 ms sample
    assert telemetry.attempts <= 4 + elapsed / 0.2, (telemetry.attempts, elapsed)
    assert delays[:3] == [0.05, 0.1, 0.2] and max(delays) == 0.2
    assert [e for e, _ in logged] == ["telemetry_degraded"]  # logged once, not on every retry


def test_auto_mode_off_jetson_reads_linux_without_degrading(no_jtop_service):
    if os.path.exists("/etc/nv_tegra_release"):
        pytest.skip("this is a Jetson")
    telemetry = Telemetry(1.0)
    assert not telemetry.wants_jtop()
    snap = telemetry.sample()
    assert snap.source == "linux" and snap.degraded is None and telemetry.attempts == 0


def test_latest_never_waits_for_a_slow_sample():
    """latest() answers while the sampler is blocked inside a read (it is what the frame loop calls)."""
    release, inside = threading.Event(), threading.Event()

    class SlowReader(LinuxReader):
        reads = 0

        def read(self, degraded=None):
            SlowReader.reads += 1
            if SlowReader.reads > 1:  # the first sample returns at once, the next one blocks
                inside.set()
                release.wait(60)
                inside.clear()
            return TelemetrySnapshot(time=time.time(), source="linux")

    telemetry = Telemetry(0.01, linux=SlowReader(), socket_path=os.devnull + ".no-jtop")
    if telemetry.wants_jtop():
        pytest.skip("this is a Jetson: telemetry would use jtop")
    telemetry.start()
    try:
        assert inside.wait(60)
        snap = telemetry.latest()
        assert inside.is_set(), "latest() returned only after the blocked read did"
        assert snap.source == "linux"
    finally:
        release.set()
        telemetry.stop()


# -- the real jtop service (jetson-stats, testing mode) ---------------------------------------------------



def test_real_jtop_service_read_through_telemetry(jtop_service):
    telemetry = Telemetry(0.5)
    assert telemetry.wants_jtop()  # auto mode: the socket exists
    try:
        snap = telemetry.sample()
        assert snap.source == "jtop", snap.degraded
        sink = MetricsSink(30.0, telemetry=telemetry.latest)
        text = generate_latest(sink.registry).decode()
    finally:
        telemetry.stop()
    assert snap.degraded is None and telemetry.connected == 1
    assert snap.gpu_load == pytest.approx(sj.GPU_LOAD_PERMILLE / 1000)
    assert snap.gpu_freq_mhz == pytest.approx(sj.GPU_CUR_HZ / 1e6)
    assert snap.cpu_freq_mhz == pytest.approx(sj.CPU_CUR_KHZ / 1e3)
    assert snap.emc_freq_mhz == pytest.approx(sj.EMC_RATE_HZ / 1e6)
    assert snap.temperatures == {"cpu": 45.5, "gpu": 43.0}
    mv, ma = sj.RAILS["VDD_IN"]
    assert snap.power_w == pytest.approx(mv * ma / 1e6)
    assert 0 < snap.ram_fraction < 1
    assert snap.nvpmodel == sj.NVP_MODES[sj.NVP_CURRENT] and snap.jetson_clocks is False
    assert 'edge_temperature_celsius{zone="cpu"} 45.5' in text
    assert 'edge_nvpmodel_info{mode="MODE_15W"} 1.0' in text and "edge_gpu_load_ratio 0.42" in text


def test_real_service_reports_clock_ceilings_and_rail_limits(jtop_service):
    telemetry = Telemetry(0.5)
    try:
        snap = telemetry.sample()
    finally:
        telemetry.stop()
    assert snap.source == "jtop", snap.degraded
    assert snap.cpu_freq_max_mhz == pytest.approx(2035.2) and snap.gpu_freq_max_mhz == pytest.approx(921.6)
    assert snap.overcurrent == {"VDD_CPU_GPU_CV": False, "TOT": False}  # 600 / 1330 mA, limit 10000 mA


def test_real_service_version_mismatch_is_degraded(jtop_service, monkeypatch):
    client_module = importlib.import_module("jtop.jtop")  # the module (jtop.jtop the attribute is the class)
    monkeypatch.setattr(client_module, "get_var", lambda regex: "4.3.1")  # an old client against 7.x
    telemetry = Telemetry(0.5)
    snap = telemetry.sample()
    telemetry.stop()
    assert snap.source == "linux" and "Mismatch version jtop service" in snap.degraded


def test_real_service_without_the_jtop_group_is_degraded(jtop_service):
    """A user outside the `jtop` group (here: nobody) gets EACCES on the socket."""
    def sample():
        snap = Telemetry(0.5).sample()
        return [snap.source, snap.degraded]

    def warm():  # a connection as root imports the jtop client and multiprocessing's managers
        # jtop reads its own __init__.py at each connection (its version, and the service's auth key from it):
        # read once here, as root
        common, client_module = importlib.import_module("jtop.core.common"), importlib.import_module("jtop.jtop")
        common.get_var = client_module.get_var = functools.lru_cache()(common.get_var)
        telemetry = Telemetry(0.5)
        assert telemetry.sample().source == "jtop"
        telemetry.stop()

    source, degraded = as_nobody(sample, warm)
    assert source == "linux" and "can't access jtop.service" in degraded


def test_service_restart_degrades_then_recovers(jtop_service):
    """Each step waits for its event: the service gone (degraded), the restarted service's control loop running
    (service_jtop waits for its `service ready` line, not for the socket plus a fixed sleep), then the reconnect.
    It flaked in the full suite (no reconnect within 30 s): the reconnect waited for the garbage collector to free
    the dead client (multiprocessing's cached pipe to the stopped service), so automatic GC is off here to make
    that certain; telemetry frees it on each failure."""
    logged = []
    telemetry = Telemetry(0.2, retry_initial_s=0.2, retry_max_s=0.4,
                          log=lambda event, **f: logged.append((event, f)))
    telemetry.start()

    def why():
        return "{} attempts, {} connected, latest {}, events {}\nservice log: {}".format(
            telemetry.attempts, telemetry.connected, telemetry.latest(), logged, jtop_service.log()[-3000:])
    try:
        assert sh.wait_until(lambda: telemetry.latest().source == "jtop"), why()
        gc.disable()
        jtop_service.stop()
        assert sh.wait_until(lambda: telemetry.latest().degraded is not None, 10), why()
        down = telemetry.latest()
        assert down.source == "linux" and down.degraded, "stopping the service did not degrade telemetry"
        jtop_service.start()
        assert sh.wait_until(lambda: telemetry.latest().source == "jtop", 15), why()
        up = telemetry.latest()
    finally:
        gc.enable()
        telemetry.stop()
    assert up.source == "jtop" and up.degraded is None and telemetry.connected == 2
    events = [e for e, _ in logged]
    assert "telemetry_degraded" in events and events[-1] == "telemetry_recovered"


def test_clock_ceilings_and_overcurrent_rails_from_jtop():
    cpu = {"cpu": [{"online": True, "freq": {"cur": 1190400, "max": 2265600}},
                   {"online": True, "freq": {"cur": 1420800, "max": 2265600}},
                   {"online": False, "freq": {"cur": 0, "max": 0}}]}
    power = {"rail": {"VDD_CPU_GPU_CV": {"volt": 5000, "curr": 3000, "warn": 3000, "crit": 4000},
                      "VDD_SOC": {"volt": 5000, "curr": 500, "warn": 2000},
                      "VDD_NOLIMIT": {"volt": 5000, "curr": 500}},  # no warn limit: not reported
             "tot": {"volt": 5000, "curr": 1970, "warn": 10000, "power": 9850}}
    snap = snapshot_from_jtop(XAVIER_STATS, cpu, XAVIER_GPU, XAVIER_MEMORY, power=power)
    assert snap.cpu_freq_max_mhz == pytest.approx(2265.6)  # offline cores do not count
    assert snap.gpu_freq_max_mhz == pytest.approx(1377.0)
    assert snap.overcurrent == {"VDD_CPU_GPU_CV": True, "VDD_SOC": False, "TOT": False}
    bare = snapshot_from_jtop({"GPU": 3}, power={"rail": {}, "tot": {}})
    assert bare.overcurrent == {} and bare.cpu_freq_max_mhz is None and bare.gpu_freq_max_mhz is None


def test_linux_reader_reports_the_devfreq_gpu_ceiling(tmp_path):
    gpu = tmp_path / "devfreq" / "17000000.gpu"
    (gpu / "device" / "of_node").mkdir(parents=True)
    (gpu / "device" / "of_node" / "name").write_text("gpu", encoding="utf-8")
    (gpu / "cur_freq").write_text("306000000", encoding="utf-8")
    (gpu / "max_freq").write_text("921600000", encoding="utf-8")
    snap = LinuxReader(str(tmp_path / "thermal"), str(tmp_path / "devfreq")).read()
    assert snap.gpu_freq_max_mhz == pytest.approx(921.6) and snap.overcurrent == {}

