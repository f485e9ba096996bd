"""The one place that knows the board: Jetson or not, its model, L4T, TensorRT, CUDA, GPU, clocks, power mode.

Every probe reads files or runs a command with a timeout and answers None/'unknown' instead of raising, so it
is safe off a Jetson. `root` arguments let tests point the probes at a fake filesystem.
"""

import importlib
import os
import platform
import re
import socket
import subprocess
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from edge.errors import first_line

NV_TEGRA_RELEASE = "etc/nv_tegra_release"  # relative to `root`


NOT_A_JETSON = "not a Jetson: clock state unknown"
CLOCKS_OFF = "jetson_clocks is off: DVFS makes timings noisy (sudo jetson_clocks)"


def read_small(path: str) -> Optional[str]:
    """A small text file (sysfs, /proc, /etc), stripped; None when it cannot be read."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            return fh.read(65536).strip()
    except OSError:
        return None


def is_jetson(root: str = "/") -> bool:
    """A Jetson (L4T) when /etc/nv_tegra_release exists."""
    return os.path.isfile(os.path.join(root, NV_TEGRA_RELEASE))


def read_l4t(root: str = "/") -> Optional[str]:
    """'R36.4.3' from '# R36 (release), REVISION: 4.3, ...'; None when not a Jetson."""
    text = read_small(os.path.join(root, NV_TEGRA_RELEASE)) or ""
    match = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    if match:
        return "R{}.{}".format(match.group(1), match.group(2))
    return text.splitlines()[0][:80] if text else None


MIN_TENSORRT = (8, 5)  # JetPack 5.1: the named-tensor API and execute_async_v3


class TensorRTProbe(NamedTuple):
    version: Optional[str]  # the installed runtime's; None when none imports (absent, broken, type stubs alone)
    problem: Optional[str]  # None when jetson-edge can use it, else why not


def tensorrt_probe() -> TensorRTProbe:
    """The one TensorRT probe (backend selection, the runner, the engine build, `edge doctor`, the system's
    identity). tensorrt-stubs alone import as a namespace package with no Runtime."""
    try:
        module = importlib.import_module("tensorrt")
    except Exception as exc:  # a broken install raises anything from ImportError to OSError
        return TensorRTProbe(None, "tensorrt not importable: {}".format(first_line(exc)))
    if not hasattr(module, "Runtime"):
        # not left imported: a namespace module with no file breaks whatever later walks sys.modules for source
        # files (torch's import does, through inspect.getmodule)
        sys.modules.pop("tensorrt", None)
        return TensorRTProbe(None, "tensorrt not importable: only type stubs are installed, no TensorRT runtime")
    version = getattr(module, "__version__", None)
    parts = (str(version or "0").split(".") + ["0"])[:2]
    if tuple(int(p) if p.isdigit() else 0 for p in parts) < MIN_TENSORRT:
        return TensorRTProbe(version, "tensorrt {}: jetson-edge needs TensorRT >= {}.{} (JetPack >= 5.1)".format(
            version, *MIN_TENSORRT))
    return TensorRTProbe(version, None)


def gpu_identity() -> Dict[str, Any]:
    """CUDA device 0 as pycuda sees it: name, compute capability, SM count, driver CUDA version (None each
    when there is no pycuda, driver or device). The name is "Orin" on every Orin: the SM count tells them apart."""
    try:
        import pycuda.driver as cuda  # optional: only on a CUDA machine
        cuda.init()
        device = cuda.Device(0)
        driver = int(cuda.get_driver_version())  # 12060 -> "12.6"
        return {"gpu": str(device.name()), "compute_capability": "{}.{}".format(*device.compute_capability()),
                "sm_count": int(device.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)),
                "cuda": "{}.{}".format(driver // 1000, driver % 1000 // 10)}
    except Exception:  # no pycuda, no driver, no device: all mean "no GPU identity here"
        return dict.fromkeys(("gpu", "compute_capability", "sm_count", "cuda"))


def device_tree(name: str, root: str = "/") -> Optional[str]:
    """A device-tree property (`model`, `compatible`: NUL-separated) as text; None off a device-tree machine.
    /proc/device-tree is a link to /sys/firmware/devicetree/base, read directly where /proc has no link."""
    for folder in ("proc/device-tree", "sys/firmware/devicetree/base"):
        text = read_small(os.path.join(root, folder, name))
        if text is not None:
            return text.rstrip("\x00").strip() or None
    return None


def board_model(root: str = "/") -> Optional[str]:
    """'NVIDIA Jetson AGX Orin Developer Kit' from the device tree's model; None elsewhere."""
    return device_tree("model", root)


# The GPU of each Tegra SoC, from the device tree's `compatible` (a build for the board without a CUDA device).
TEGRA_ARCH = {"tegra194": "sm_72", "tegra234": "sm_87", "tegra264": "sm_110"}


def tegra_arch(root: str = "/") -> Optional[str]:
    """'sm_87' on an Orin (`nvidia,tegra234` in the device tree's compatible list); None when it names none."""
    compatible = (device_tree("compatible", root) or "").replace("\x00", " ").split()
    return next((TEGRA_ARCH[c.split(",")[-1]] for c in compatible if c.split(",")[-1] in TEGRA_ARCH), None)


def current_system(root: str = "/") -> Dict[str, Any]:
    """The running system's identity: what an engine is tied to (edge.store.artifact.ENGINE_SYSTEM_KEYS), L4T, the CPU
    runtime."""
    trt = tensorrt_probe().version
    system: Dict[str, Any] = {"tensorrt": trt, "board": board_model(root)}
    system.update(gpu_identity() if trt else dict.fromkeys(("gpu", "compute_capability", "sm_count", "cuda")))
    system.update({"l4t": read_l4t(root), "onnxruntime": package_version("onnxruntime"), "machine": platform.machine()})
    return system


class PowerMode(NamedTuple):
    """One `< POWER_MODEL ID=n NAME=x >` block of nvpmodel.conf: its watts from the name (None when the name gives
    none; MAXN has no cap), and the CPU cores it leaves online."""

    id: int
    name: str
    watts: Optional[float]
    cores: int

    def __str__(self) -> str:
        return "{} ({})".format(self.name, self.id)


def is_maxn(name: str) -> bool:
    return name.upper().startswith("MAXN")  # MAXN, MAXN_SUPER: no power cap


def power_modes(conf: str) -> List[PowerMode]:
    """The power modes an nvpmodel.conf defines, in file order (comment lines skipped)."""
    modes: List[PowerMode] = []
    current: Optional[List[Any]] = None
    for line in (raw.strip() for raw in conf.splitlines()):
        header = re.match(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>", line)
        if header or line.startswith("<"):  # a new mode, or PARAM / PM_CONFIG: the block before it ends
            if current is not None:
                modes.append(PowerMode(*current))
            current = None
        if header:
            watts = re.search(r"(?:^|_)(\d+(?:\.\d+)?)W(?:_|$)", header.group(2).upper())
            current = [int(header.group(1)), header.group(2), float(watts.group(1)) if watts else None, 0]
        elif current is not None and re.match(r"CPU_ONLINE\s+CORE_\d+\s+1$", line):
            current[3] += 1
    if current is not None:
        modes.append(PowerMode(*current))
    return modes


def max_power_mode(modes: List[PowerMode]) -> Optional[PowerMode]:
    """The board's highest-power mode: its MAXN when it has one, else the most watts named, ties broken by the
    cores online (Xavier NX: MODE_20W_6CORE, id 8, not mode 0, MODE_15W_2CORE). None ("unknown") rather than a
    guess: no modes, a mode whose name gives no watts, or a tie that the core count does not break."""
    maxn = [m for m in modes if is_maxn(m.name)]
    ranked = maxn or modes
    if not ranked or (not maxn and any(m.watts is None for m in modes)):
        return None
    key = (lambda m: m.cores) if maxn else (lambda m: (m.watts, m.cores))
    best = max(key(m) for m in ranked)
    top = [m for m in ranked if key(m) == best]
    return top[0] if len(top) == 1 else None


def _nvpmodel(root: str, timeout_s: float = 5.0) -> Tuple[Optional[str], Optional[int], Optional[PowerMode], str]:
    """(mode name, mode id, the board's maximum mode or None, problem) from `nvpmodel -q` and /etc/nvpmodel.conf."""
    try:
        proc = subprocess.run(["nvpmodel", "-q"], capture_output=True,
                              encoding="utf-8", errors="replace", timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, None, None, "nvpmodel -q failed ({})".format(type(exc).__name__)
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("NV Power Mode")), None)
    mode_id = next((int(ln) for ln in lines if ln.isdigit()), None)
    if name is None:
        return None, None, None, "nvpmodel -q said nothing usable"
    return name, mode_id, max_power_mode(power_modes(read_small(os.path.join(root, "etc/nvpmodel.conf")) or "")), ""


def _min_eq_max(folder: str, lo: str, hi: str) -> Optional[bool]:
    a, b = read_small(os.path.join(folder, lo)), read_small(os.path.join(folder, hi))
    if a is None or b is None or not a.isdigit() or not b.isdigit():
        return None
    return int(a) == int(b)


def jetson_clocks_state(root: str = "/") -> str:
    """'on' when every online CPU and the GPU run with min = max frequency (what jetson_clocks sets), else
    'off'; 'unknown' when sysfs does not say."""
    cpus = []
    cpu_root = os.path.join(root, "sys/devices/system/cpu")
    for name in sorted(os.listdir(cpu_root)) if os.path.isdir(cpu_root) else []:
        freq = os.path.join(cpu_root, name, "cpufreq")
        if name[3:].isdigit() and name.startswith("cpu") and os.path.isdir(freq):
            if read_small(os.path.join(cpu_root, name, "online")) == "0":
                continue
            cpus.append(_min_eq_max(freq, "scaling_min_freq", "scaling_max_freq"))
    gpus = []
    devfreq = os.path.join(root, "sys/class/devfreq")
    for name in sorted(os.listdir(devfreq)) if os.path.isdir(devfreq) else []:
        if any(k in name for k in ("gpu", "ga10b", "gv11b", "gp10b", "gk20a", "gb10b")):
            gpus.append(_min_eq_max(os.path.join(devfreq, name), "min_freq", "max_freq"))
    states = cpus + gpus
    if not gpus or not cpus or any(s is None for s in states):
        return "unknown"
    return "on" if all(states) else "off"


def clock_state(root: str = "/") -> Tuple[Dict[str, Any], List[str]]:
    """({jetson, l4t, board, nvpmodel, nvpmodel_max (at the maximum mode?), nvpmodel_max_mode, jetson_clocks},
    warnings about DVFS)."""
    if not is_jetson(root):
        return {"jetson": False, "l4t": None, "board": None, "nvpmodel": None, "nvpmodel_max": None,
                "nvpmodel_max_mode": None, "jetson_clocks": "unknown"}, [NOT_A_JETSON]
    state: Dict[str, Any] = {"jetson": True, "l4t": read_l4t(root), "board": board_model(root)}
    warnings = []
    name, mode_id, top, problem = _nvpmodel(root)
    state["nvpmodel"] = None if name is None else "{} ({})".format(name, mode_id) if mode_id is not None else name
    state["nvpmodel_max_mode"] = None if top is None else str(top)
    at_max = None if top is None or name is None else (mode_id == top.id if mode_id is not None else name == top.name)
    state["nvpmodel_max"] = at_max
    if problem:
        warnings.append("nvpmodel: {}: power mode unknown".format(problem))
    elif top is None:
        warnings.append("nvpmodel is '{}'; the maximum power mode is unknown (/etc/nvpmodel.conf names no MAXN and "
                        "no watts that rank its modes)".format(name))
    elif at_max is False:
        warnings.append("nvpmodel is '{}', not the maximum power mode {}: timings reflect capped clocks "
                        "(sudo nvpmodel -m {})".format(name, top, top.id))
    clocks = jetson_clocks_state(root)
    state["jetson_clocks"] = clocks
    if clocks == "off":
        warnings.append(CLOCKS_OFF)
    elif clocks == "unknown":
        warnings.append("jetson_clocks state unknown (no cpufreq/devfreq min/max in sysfs)")
    return state, warnings


def package_version(module: str) -> Optional[str]:
    """An optional package's version, or None when it is absent or broken."""
    try:
        return str(__import__(module).__version__)
    except Exception:  # absent or broken optional package: reported as null
        return None


def system_info(clocks: Dict[str, Any]) -> Dict[str, Any]:
    info = {
        "hostname": socket.gethostname(), "platform": platform.platform(), "machine": platform.machine(),
        "python": platform.python_version(), "cpu_count": os.cpu_count() or 0,
        "onnxruntime": package_version("onnxruntime"), "tensorrt": tensorrt_probe().version,
        "opencv": package_version("cv2"),
    }
    info.update(clocks)
    return info
