"""Board telemetry in a side thread: jtop (jetson-stats) on a Jetson, /proc + /sys elsewhere.

The frame loop never waits for telemetry: a `Telemetry` thread samples every `service.telemetry.interval_s`
and swaps in a new immutable `TelemetrySnapshot`; `latest()` is an attribute read. Budget-miss log lines,
summaries and the Prometheus gauges all read that snapshot.

Sources:
  jtop   when the jtop package imports and /run/jtop.sock exists (or /etc/nv_tegra_release says Jetson).
         Its failures (service not running, socket permission, client/service version mismatch, lost
         connection; all `JtopException`) never stop the service: the snapshot is marked `degraded` with
         the reason, the Linux reader fills what it can meanwhile, and the connection is retried with
         exponential backoff (edge.sources.watch.Backoff, the cameras' too).
  linux  psutil (or /proc/meminfo) + /sys/class/thermal + a devfreq GPU node if there is one. Off a Jetson
         this is the normal source and not "degraded".

jtop keys are read defensively: boards differ (Orin/Thor lack EMC or power rails, `nvpmodel` is None on
some), the simplified stats dict spells the power mode 'nvp model', RAM there is a fraction 0-1, frequencies
in the structured attributes are kHz, offline temperature sensors read -256.

Throttle signals for the fleet alerts (deploy/prometheus/rules.yml): the current clock ceilings (CPU/GPU
`freq.max`, what nvpmodel and thermal/over-current capping allow) and, per jtop power rail, whether its current
has reached the rail's warning limit (INA3221 `currN_max`), where the hardware starts throttling.
"""

import contextlib
import gc
import glob
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

from edge.board import is_jetson, read_small
from edge.sources.watch import Backoff

JTOP_SOCKET = "/run/jtop.sock"
OFFLINE_TEMP = -256.0  # what jtop reports for a sensor that is offline


@dataclass(frozen=True)
class TelemetrySnapshot:
    time: float  # wall clock (time.time()) when sampled
    source: str  # jtop | linux | none
    degraded: Optional[str] = None  # why the preferred source (jtop) is not the one read; None when healthy
    gpu_load: Optional[float] = None  # ratio 0-1
    cpu_load: Optional[float] = None  # ratio 0-1, mean over online cores
    cpu_freq_mhz: Optional[float] = None  # mean current frequency of online cores
    gpu_freq_mhz: Optional[float] = None
    cpu_freq_max_mhz: Optional[float] = None  # mean ceiling of online cores (scaling max)
    gpu_freq_max_mhz: Optional[float] = None
    emc_freq_mhz: Optional[float] = None  # memory controller
    temperatures: Dict[str, float] = field(default_factory=dict)  # zone -> degrees C
    power_w: Optional[float] = None  # total board power (jtop 'Power TOT')
    ram_fraction: Optional[float] = None  # used / total, 0-1
    nvpmodel: Optional[str] = None  # power mode name, e.g. MAXN, 15W
    jetson_clocks: Optional[bool] = None
    overcurrent: Dict[str, bool] = field(default_factory=dict)  # power rail -> current at its warning limit

    def brief(self) -> Dict[str, Any]:
        """The compact form log lines carry: only what is known, rounded."""
        out: Dict[str, Any] = {"source": self.source, "age_s": round(max(0.0, time.time() - self.time), 1)}
        if self.degraded:
            out["degraded"] = self.degraded
        for name, digits in (("gpu_load", 3), ("cpu_load", 3), ("ram_fraction", 3), ("cpu_freq_mhz", 1),
                             ("gpu_freq_mhz", 1), ("emc_freq_mhz", 1), ("power_w", 1)):
            value = getattr(self, name)
            if value is not None:
                out[name] = round(value, digits)
        if self.temperatures:
            out["temp_max_c"] = round(max(self.temperatures.values()), 1)
            out["temp_c"] = {k: round(v, 1) for k, v in self.temperatures.items()}
        out.update({k: getattr(self, k) for k in ("nvpmodel", "jetson_clocks") if getattr(self, k) is not None})
        return out


def _number(value: Any) -> Optional[float]:
    """A finite float, or None for 'OFF', None, strings and other non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _get(mapping: Any, *path: Any) -> Any:
    """mapping[path[0]][path[1]]... or None when any step is missing or not a mapping."""
    node = mapping
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _mean(values: Iterable[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _overcurrent(power: Any) -> Dict[str, bool]:
    """jtop `power` {'rail': {name: {curr, warn, ...}}, 'tot': {...}} -> {rail: curr >= warn} (rails with a limit)."""
    rail, tot = _get(power, "rail"), _get(power, "tot")
    rails = dict(rail) if isinstance(rail, Mapping) else {}
    if isinstance(tot, Mapping):
        rails["TOT"] = tot  # VDD_IN / POM_5V_IN / VIN, which jtop moves out of the rails
    out: Dict[str, bool] = {}
    for name, rail in rails.items():
        curr, warn = _number(_get(rail, "curr")), _number(_get(rail, "warn"))
        if curr is not None and warn is not None and warn > 0:
            out[str(name)] = curr >= warn
    return out


def snapshot_from_jtop(stats: Mapping[str, Any], cpu: Any = None, gpu: Any = None, memory: Any = None,
                       now: Optional[float] = None, power: Any = None) -> TelemetrySnapshot:
    """Map jtop's `stats` dict (plus the structured `cpu`, `gpu`, `memory`, `power` attributes when available) to
    a snapshot. Every key is optional: what a board does not report stays None."""
    stats = stats or {}
    temps: Dict[str, float] = {}
    for key, value in stats.items():
        if isinstance(key, str) and key.startswith("Temp "):
            t = _number(value)
            if t is not None and t > OFFLINE_TEMP:
                temps[key[5:]] = t
    cpu_loads = [_number(v) for k, v in stats.items() if isinstance(k, str) and k[:3] == "CPU" and k[3:].isdigit()]
    gpu_load = _number(stats.get("GPU"))
    if gpu_load is None:
        gpu_load = _number(_get(_first_value(gpu), "status", "load"))
    total_mw = _number(stats.get("Power TOT"))
    nvp = stats.get("nvp model", stats.get("nvpmodel"))  # 'nvp model' is the real key; the docstring says nvpmodel
    jc = stats.get("jetson_clocks")
    cores = _get(cpu, "cpu") if cpu is not None else None
    online = [c for c in cores if isinstance(c, Mapping) and c.get("online", True)] \
        if isinstance(cores, (list, tuple)) else []
    cpu_khz = _mean(_number(_get(core, "freq", "cur")) for core in online)
    cpu_max_khz = _mean(_number(_get(core, "freq", "max")) for core in online)
    gpu_khz = _number(_get(_first_value(gpu), "freq", "cur"))
    gpu_max_khz = _number(_get(_first_value(gpu), "freq", "max"))
    emc_khz = _number(_get(memory, "EMC", "cur"))
    ram = _number(stats.get("RAM"))
    return TelemetrySnapshot(
        time=time.time() if now is None else now,
        source="jtop",
        gpu_load=gpu_load / 100.0 if gpu_load is not None else None,
        cpu_load=_mean(v / 100.0 for v in cpu_loads if v is not None),
        cpu_freq_mhz=cpu_khz / 1000.0 if cpu_khz is not None else None,
        gpu_freq_mhz=gpu_khz / 1000.0 if gpu_khz is not None else None,
        cpu_freq_max_mhz=cpu_max_khz / 1000.0 if cpu_max_khz is not None else None,
        gpu_freq_max_mhz=gpu_max_khz / 1000.0 if gpu_max_khz is not None else None,
        emc_freq_mhz=emc_khz / 1000.0 if emc_khz is not None else None,
        temperatures=temps,
        power_w=total_mw / 1000.0 if total_mw is not None else None,  # jtop reports mW
        ram_fraction=ram,  # already used/total in stats
        nvpmodel=str(nvp) if nvp is not None else None,
        jetson_clocks={"ON": True, "OFF": False}.get(str(jc).upper()) if jc is not None else None,
        overcurrent=_overcurrent(power),
    )


def _first_value(mapping: Any) -> Any:
    try:
        return next(iter(mapping.values())) if mapping else None
    except (AttributeError, TypeError, StopIteration):
        return None


class LinuxReader:
    """What a plain Linux system tells without jtop: RAM, CPU load/frequency, thermal zones, a devfreq GPU."""

    def __init__(self, thermal_root: str = "/sys/class/thermal", devfreq_root: str = "/sys/class/devfreq",
                 meminfo: str = "/proc/meminfo"):
        self.thermal_root, self.devfreq_root, self.meminfo = thermal_root, devfreq_root, meminfo
        try:
            import psutil

            self._psutil: Any = psutil
            psutil.cpu_percent(interval=None)  # primes the counter: the next call measures since now
        except ImportError:
            self._psutil = None

    def temperatures(self) -> Dict[str, float]:
        temps: Dict[str, float] = {}
        for zone in sorted(glob.glob(os.path.join(self.thermal_root, "thermal_zone*"))):
            name, raw = read_small(os.path.join(zone, "type")), read_small(os.path.join(zone, "temp"))
            try:
                value = int(raw or "") / 1000.0  # millidegrees
            except ValueError:
                continue
            if value <= OFFLINE_TEMP:
                continue
            name = name or os.path.basename(zone)
            if name in temps:
                name = "{}.{}".format(name, os.path.basename(zone)[len("thermal_zone"):])
            temps[name] = value
        return temps

    def _ram_fraction(self) -> Optional[float]:
        if self._psutil is not None:
            return self._psutil.virtual_memory().percent / 100.0
        fields: Dict[str, int] = {}
        for line in (read_small(self.meminfo) or "").splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1])
        total, available = fields.get("MemTotal"), fields.get("MemAvailable")
        return (total - available) / total if total and available is not None else None

    def _gpu(self) -> Dict[str, Optional[float]]:
        """A Jetson iGPU exposed through devfreq (cur_freq in Hz, device/load in per mille)."""
        for node in sorted(glob.glob(os.path.join(self.devfreq_root, "*"))):
            name = read_small(os.path.join(node, "device", "of_node", "name")) or os.path.basename(node)
            if "gpu" not in name.lower():
                continue
            freq, load = read_small(os.path.join(node, "cur_freq")), read_small(os.path.join(node, "device", "load"))
            top = read_small(os.path.join(node, "max_freq"))
            return {"gpu_freq_mhz": int(freq) / 1e6 if freq and freq.isdigit() else None,
                    "gpu_freq_max_mhz": int(top) / 1e6 if top and top.isdigit() else None,
                    "gpu_load": int(load) / 1000.0 if load and load.isdigit() else None}
        return {}

    def read(self, degraded: Optional[str] = None) -> TelemetrySnapshot:
        cpu_load = cpu_mhz = cpu_max_mhz = None
        if self._psutil is not None:
            cpu_load = self._psutil.cpu_percent(interval=None) / 100.0
            try:
                freq = self._psutil.cpu_freq()
            except (OSError, NotImplementedError, FileNotFoundError):
                freq = None
            cpu_mhz = float(freq.current) if freq is not None and freq.current else None
            cpu_max_mhz = float(freq.max) if freq is not None and freq.max else None  # 0 where unknown (VMs)
        gpu = self._gpu()
        return TelemetrySnapshot(time=time.time(), source="linux", degraded=degraded, cpu_load=cpu_load,
                                 cpu_freq_mhz=cpu_mhz, cpu_freq_max_mhz=cpu_max_mhz, temperatures=self.temperatures(),
                                 ram_fraction=self._ram_fraction(), gpu_freq_mhz=gpu.get("gpu_freq_mhz"),
                                 gpu_freq_max_mhz=gpu.get("gpu_freq_max_mhz"), gpu_load=gpu.get("gpu_load"))


def jtop_reason(exc: BaseException) -> str:
    """One line for a jtop failure, keeping jtop's own words ('not active', "can't access", 'Mismatch version')."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return "jtop: " + (text if len(text) <= 200 else text[:197] + "...")


class Telemetry:
    """Samples in its own thread; `latest()` never blocks. jtop where it should be (`wants_jtop`), else Linux."""

    def __init__(self, interval_s: float = 1.0, log: Optional[Callable[..., None]] = None,
                 retry_initial_s: Optional[float] = None, retry_max_s: float = 60.0, socket_path: str = JTOP_SOCKET,
                 linux: Optional[LinuxReader] = None):
        self.interval_s = interval_s
        self.log = log
        self.backoff = Backoff(retry_initial_s if retry_initial_s is not None else max(1.0, interval_s), retry_max_s)
        self.socket_path = socket_path
        self.linux = linux or LinuxReader()
        self.attempts = 0  # jtop connection attempts
        self.connected = 0  # successful jtop connections
        self.retry_delays: list = []  # the backoff actually applied after each failed attempt
        self._client: Any = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._latest = TelemetrySnapshot(time=time.time(), source="none", degraded="not sampled yet")
        self._degraded: Optional[str] = None
        self._next_attempt = 0.0
        self._retry_in = self.backoff.delay  # the wait before the next connection attempt
        self._use_jtop: Optional[bool] = None

    def wants_jtop(self) -> bool:
        """jetson-stats installed, and its service's socket there or this a Jetson (where it should be)."""
        from importlib.util import find_spec

        return find_spec("jtop") is not None and (os.path.exists(self.socket_path)
                                                  or is_jetson())

    def latest(self) -> TelemetrySnapshot:
        return self._latest

    def start(self) -> "Telemetry":
        self._use_jtop = self.wants_jtop()
        if not self._use_jtop:
            self.sample()  # quick and local: a first snapshot before the first frame
        # jtop is first contacted in the thread: a service that accepts but never answers must not block start-up
        self._thread = threading.Thread(target=self._run, args=(self._use_jtop,), name="edge-telemetry", daemon=True)
        self._thread.start()
        return self

    def _run(self, sample_first: bool) -> None:
        if sample_first or not self._stop.wait(self.interval_s):
            while True:
                try:
                    self.sample()
                except Exception as exc:  # telemetry must never take the service down
                    self._set_degraded("telemetry error: {}: {}".format(type(exc).__name__, exc))
                if self._stop.wait(self.interval_s):
                    break

    def _emit(self, event: str, level: str, **fields: Any) -> None:
        if self.log is not None:
            try:
                self.log(event, level=level, **fields)
            except Exception:
                pass

    def _set_degraded(self, reason: Optional[str]) -> None:
        if reason == self._degraded:
            return
        previous, self._degraded = self._degraded, reason
        if reason is None:
            self._emit("telemetry_recovered", "info", source="jtop", was=previous)
        else:
            self._emit("telemetry_degraded", "warning", reason=reason, retry_in_s=round(self._retry_in, 2),
                       fallback="linux")

    def _connect(self) -> None:
        self.attempts += 1
        try:
            from jtop import jtop
        except ImportError as exc:
            raise RuntimeError("jetson-stats not installed ({}): pip install 'jetson-edge[jetson]'".format(
                exc)) from None
        self._client = jtop(interval=self.interval_s)
        try:
            self._client.start()
        except BaseException:
            self._disconnect()
            raise
        self.connected += 1

    def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def _failed(self, exc: BaseException, now: float) -> None:
        self._disconnect()
        gc.collect()  # free the dead client's reference cycle now: its cached pipe breaks every reconnect until then
        self._retry_in = self.backoff.next()
        self.retry_delays.append(self._retry_in)
        self._next_attempt = now + self._retry_in
        self._set_degraded(jtop_reason(exc))

    def sample(self) -> TelemetrySnapshot:
        """Take one sample now (the thread calls this every interval)."""
        if self._use_jtop is None:
            self._use_jtop = self.wants_jtop()
        snap = None
        if self._use_jtop:
            now = time.monotonic()
            if self._client is None and now >= self._next_attempt:
                try:
                    self._connect()
                except Exception as exc:  # JtopException and whatever a broken install raises
                    self._failed(exc, now)
            if self._client is not None:
                try:
                    snap = self._read_client(self._client)
                except Exception as exc:
                    self._failed(exc, now)
                    snap = None
                else:
                    self.backoff.reset()
                    self._set_degraded(None)
        if snap is None:
            snap = self.linux.read(degraded=self._degraded if self._use_jtop else None)
        self._latest = snap
        return snap

    @staticmethod
    def _read_client(client: Any) -> TelemetrySnapshot:
        if not client.ok(spin=True):  # raises what the client's reader thread caught (e.g. lost connection)
            raise RuntimeError("jtop client stopped")

        def attr(name: str) -> Any:
            try:
                return getattr(client, name)
            except Exception:  # a board without that part raises from the property
                return None

        stats = attr("stats") or {}
        return snapshot_from_jtop(stats, attr("cpu"), attr("gpu"), attr("memory"), power=attr("power"))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._disconnect()
