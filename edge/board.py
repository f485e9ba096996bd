"""The one place that knows the board: Jetson or not, its model, L4T, TensorRT, CUDA, GPU, clocks, power mode.

Every probe reads files or runs a command with a timeout and answers None/'unknown' instead of raising, so it
is safe off a Jetson. `root` arguments let tests point the probes at a fake filesystem.
"""

import os
import platform
import re
import socket
import subprocess
from typing import Any, Dict, List, Optional, Tuple

NV_TEGRA_RELEASE = "etc/nv_tegra_release"  # relative to `root`


NOT_A_JETSON = "not a Jetson: clock state unknown"


def _read(path: str) -> Optional[str]:
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
    try:
        with open(os.path.join(root, NV_TEGRA_RELEASE), "r", encoding="utf-8", errors="replace") as fh:
            text = fh.read(4096)
    except OSError:
        return None
    match = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    if match:
        return "R{}.{}".format(match.group(1), match.group(2))
    return text.strip().splitlines()[0][:80] if text.strip() else None


def tensorrt_version() -> Optional[str]:
    """The installed TensorRT's version, or None (a stub-only `tensorrt` package has none)."""
    try:
        import tensorrt
    except ImportError:
        return None
    return getattr(tensorrt, "__version__", None) if hasattr(tensorrt, "Builder") else None


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


def board_model(root: str = "/") -> Optional[str]:
    """'NVIDIA Jetson AGX Orin Developer Kit' from /proc/device-tree/model; None elsewhere."""
    model = (_read(os.path.join(root, "proc/device-tree/model")) or "").rstrip("\x00").strip()
    return model or None


def current_system(root: str = "/") -> Dict[str, Any]:
    """The running system's identity: what an engine is tied to (edge.artifact.ENGINE_SYSTEM_KEYS), L4T, the CPU
    runtime."""
    trt = tensorrt_version()
    system: Dict[str, Any] = {"tensorrt": trt, "board": board_model(root)}
    system.update(gpu_identity() if trt else dict.fromkeys(("gpu", "compute_capability", "sm_count", "cuda")))
    system.update({"l4t": read_l4t(root), "onnxruntime": package_version("onnxruntime"), "machine": platform.machine()})
    return system


def _nvpmodel(root: str, timeout_s: float = 5.0) -> Tuple[Optional[str], Optional[int], Optional[bool], str]:
    """(mode name, mode id, at max?, problem) from `nvpmodel -q` and the modes in /etc/nvpmodel.conf."""
    try:
        proc = subprocess.run(["nvpmodel", "-q"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, None, None, "nvpmodel -q failed ({})".format(type(exc).__name__)
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("NV Power Mode")), None)
    mode_id = next((int(ln) for ln in lines if ln.isdigit()), None)
    if name is None:
        return None, None, None, "nvpmodel -q said nothing usable"
    conf = _read(os.path.join(root, "etc/nvpmodel.conf")) or ""
    modes = {int(i): n for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)", conf)}
    maxn = [i for i, n in modes.items() if "MAXN" in n.upper()]
    if maxn:  # MAXN / MAXN_SUPER: the unconstrained mode where the board has one
        at_max = mode_id in maxn if mode_id is not None else "MAXN" in name.upper()
    elif modes:
        at_max = mode_id == min(modes)  # by convention mode 0 is the highest-power one
    else:
        at_max = "MAXN" in name.upper() or None
    return name, mode_id, at_max, ""


def _min_eq_max(folder: str, lo: str, hi: str) -> Optional[bool]:
    a, b = _read(os.path.join(folder, lo)), _read(os.path.join(folder, hi))
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
            if _read(os.path.join(cpu_root, name, "online")) == "0":
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
    """({jetson, l4t, board, nvpmodel, nvpmodel_max, jetson_clocks}, warnings about DVFS)."""
    if not is_jetson(root):
        return {"jetson": False, "l4t": None, "board": None, "nvpmodel": None, "nvpmodel_max": None,
                "jetson_clocks": "unknown"}, [NOT_A_JETSON]
    state: Dict[str, Any] = {"jetson": True, "l4t": read_l4t(root), "board": board_model(root)}
    warnings = []
    name, mode_id, at_max, problem = _nvpmodel(root)
    state["nvpmodel"] = None if name is None else "{} ({})".format(name, mode_id) if mode_id is not None else name
    state["nvpmodel_max"] = at_max
    if problem:
        warnings.append("nvpmodel: {}: power mode unknown".format(problem))
    elif at_max is False:
        warnings.append("nvpmodel is '{}', not the maximum power mode: timings reflect capped clocks "
                        "(sudo nvpmodel -m <max id>)".format(name))
    clocks = jetson_clocks_state(root)
    state["jetson_clocks"] = clocks
    if clocks == "off":
        warnings.append("jetson_clocks is off: DVFS makes timings noisy (sudo jetson_clocks)")
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
        "onnxruntime": package_version("onnxruntime"), "tensorrt": tensorrt_version(), "opencv": package_version("cv2"),
    }
    info.update(clocks)
    return info
