"""The preprocessing kernel's binary: compiled ahead of time, never by the service; loaded at start.

`load_kernel` tries, in order, and returns the first module the driver loads with both kernels:
  1. <kernel dir>/preprocess-sm_XY-cudaA.B-<source hash>.cubin: built on the device for its GPU by its own
     nvcc (`scripts/build_kernel.py`; scripts/install_service.sh runs it into /var/lib/jetson-edge/kernels): the
     first choice, made by the toolkit of the driver it runs on;
  2. the kernel prebuilt for the driver's CUDA major version and this GPU, shipped in edge/cuda/ and listed in
     edge/cuda/prebuilt.json (toolkit, targets, source hash): CUDA 11.x drivers (JetPack 5) sm_72 and sm_87 and
     CUDA 12.x (JetPack 6) sm_87 SASS plus compute_87 PTX, built by NVRTC 11.8 and 12.2 from PyPI's
     nvidia-cuda-nvrtc-cu11/-cu12 wheels (`scripts/build_kernel.py --prebuilt`, edge/model/prebuilt_kernels.py);
     CUDA 13.x (JetPack 7) the fatbin of nvcc 13: SASS for sm_87 and sm_110 plus compute_110 PTX
     (`scripts/build_kernel.py --fatbin`). SASS of one major version loads on that major's drivers, not across
     majors; PTX is JIT-compiled by its own and later drivers. Every binary that has SASS for the GPU under this
     driver is tried before any PTX (newest PTX first).
tests/test_kernel_aot.py checks the prebuilt binaries are current and what the registry toolchains build.
Kernel dir: $EDGE_KERNEL_DIR, else $STATE_DIRECTORY/kernels (inside the unit), else /var/lib/jetson-edge/kernels
(the installed service's state directory): the CLI, `edge doctor` and the service find the same kernel. nvcc's
temporary files go to a private folder inside the output folder, so an unwritable /tmp does not matter; nvcc's own
message is kept in the error.
"""

import functools
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Tuple

from edge.errors import EXIT_FAIL, EdgeError, first_line, require
from edge.store.artifact import sha256_file
from edge.store.fileio import temp_dir, write_json_atomic

CUDA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda")
SOURCES = ("preprocess.cu", "preprocess.cuh")
KERNELS = ("edge_preprocess_f32", "edge_preprocess_f16")
FATBIN = os.path.join(CUDA_DIR, "preprocess.fatbin")
FATBIN_TARGETS = ("arch=compute_87,code=sm_87", "arch=compute_110,code=[sm_110,compute_110]")
PREBUILT = os.path.join(CUDA_DIR, "prebuilt.json")  # what each shipped binary is: toolkit, targets, source hash
CXX_FLAGS = ("-std=c++14",)
SERVICE_KERNEL_DIR = "/var/lib/jetson-edge/kernels"  # the unit's StateDirectory=jetson-edge, + kernels


class KernelUnavailable(EdgeError):
    """No kernel binary loads on this GPU (exit 2 when preprocess.device is cuda; `auto` uses the CPU)."""


@functools.lru_cache(maxsize=1)
def source_sha256() -> str:
    """Of the shipped kernel sources: read once per process (they ship with the package and never change under it)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        with open(os.path.join(CUDA_DIR, name), "rb") as fh:
            digest.update(fh.read())
    return digest.hexdigest()


def find_nvcc() -> str:
    """nvcc on PATH, else JetPack's /usr/local/cuda/bin/nvcc (not on PATH by default)."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.isfile(nvcc):
        raise EdgeError("nvcc not found (needed once, at install, to build the preprocessing kernel): "
                        "apt install cuda-nvcc-<version>, or add /usr/local/cuda/bin to PATH")
    return nvcc


def nvcc_version(nvcc: str) -> str:
    """'12.6.68' from `nvcc --version` ('Cuda compilation tools, release 12.6, V12.6.68')."""
    out = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         encoding="utf-8", errors="replace").stdout
    match = re.search(r"release [\d.]+, V(\d+\.\d+[\d.]*)", out)
    if match is None:
        raise EdgeError("{} --version says no release: {}".format(nvcc, out.strip()[:200]))
    return match.group(1)


def kernel_dir_and_why() -> Tuple[str, str]:
    """(the kernel dir, which setting chose it)."""
    if os.environ.get("EDGE_KERNEL_DIR"):
        return os.environ["EDGE_KERNEL_DIR"], "$EDGE_KERNEL_DIR"
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return os.path.join(state, "kernels"), "the unit's $STATE_DIRECTORY"
    return SERVICE_KERNEL_DIR, "the service's state directory"


def kernel_dir() -> str:
    return kernel_dir_and_why()[0]


def cubin_name(arch: str, cuda: str) -> str:
    return "preprocess-{}-cuda{}-{}.cubin".format(arch, cuda, source_sha256()[:16])


def run_nvcc(nvcc: str, args: List[str], out: str) -> None:
    """nvcc `args` -> `out` (atomically), with TMPDIR in a private folder beside `out`."""
    folder = os.path.dirname(os.path.abspath(out))
    with temp_dir(folder, ".nvcc-") as tmp:
        staged = os.path.join(tmp, os.path.basename(out))
        cmd = [nvcc, *CXX_FLAGS, *args, "-I", CUDA_DIR, "-o", staged, os.path.join(CUDA_DIR, "preprocess.cu")]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, encoding="utf-8", errors="replace",
                              cwd=tmp, env=dict(os.environ, TMPDIR=tmp, TMP=tmp, TEMP=tmp))
        if proc.returncode != 0:
            said = "; ".join(ln.strip() for ln in proc.stdout.splitlines() if ln.strip())[:500]
            raise EdgeError("nvcc failed on edge/cuda/preprocess.cu ({}): {}".format(
                " ".join(args), said or "exit status {}".format(proc.returncode)), exit_code=EXIT_FAIL)
        os.replace(staged, out)


def build_cubin(arch: str, out_dir: Optional[str] = None, nvcc: Optional[str] = None) -> str:
    """The kernel for one GPU (`sm_87`) into the kernel dir, named by arch, CUDA version and source hash."""
    nvcc = nvcc or find_nvcc()
    cuda = ".".join(nvcc_version(nvcc).split(".")[:2])
    path = os.path.join(out_dir or kernel_dir(), cubin_name(arch, cuda))
    run_nvcc(nvcc, ["--cubin", "-arch", arch], path)
    return path


def build_fatbin(nvcc: Optional[str] = None, out: str = FATBIN, record: str = PREBUILT) -> Dict[str, Any]:
    """Regenerate the shipped CUDA 13.x fatbin and its entry in `record` (deterministic for one nvcc)."""
    nvcc = nvcc or find_nvcc()
    args = ["--fatbin"] + [a for target in FATBIN_TARGETS for a in ("-gencode", target)]
    run_nvcc(nvcc, args, out)
    version = nvcc_version(nvcc)
    entry = {"file": os.path.basename(out), "driver": int(version.split(".")[0]), "toolkit": "nvcc " + version,
             "targets": ["sm_87", "sm_110", "compute_110"], "args": list(CXX_FLAGS) + args}
    return record_prebuilt(entry, out, record)


def record_prebuilt(entry: Dict[str, Any], path: str, record: str = PREBUILT) -> Dict[str, Any]:
    """Add (or replace) the entry of one shipped binary in the record, with its hash and the sources' hash."""
    entry = dict(entry, sha256=sha256_file(path), source_sha256=source_sha256())
    kernels = [k for k in prebuilt(record) if k["file"] != entry["file"]] + [entry]
    write_json_atomic(record, {"kernels": sorted(kernels, key=lambda k: (k["driver"], k["file"]))}, "kernel record")
    return entry


def prebuilt(record: str = PREBUILT) -> List[Dict[str, Any]]:
    """The shipped binaries' entries: file, driver (CUDA major), toolkit, targets, sha256, source_sha256."""
    try:
        with open(record, "r", encoding="utf-8") as fh:
            return list(json.load(fh).get("kernels", []))
    except (OSError, ValueError):
        return []


def device_arch() -> Tuple[str, str]:
    """(`sm_XY`, where from): CUDA device 0 (pycuda), for building on the device; else the Jetson's SoC from its
    device tree (an install in a chroot or image build, or one whose account cannot open the GPU yet)."""
    from edge.board import tegra_arch

    try:
        drv = require("pycuda.driver")
        drv.init()
        major, minor = drv.Device(0).compute_capability()
        return "sm_{}{}".format(major, minor), "CUDA device 0"
    except Exception as exc:  # EdgeError (no pycuda), pycuda._driver.Error: no driver or device
        arch = tegra_arch()
        if arch is None:
            raise EdgeError("no CUDA device to build the kernel for ({}); name one with --arch sm_87".format(
                first_line(exc))) from None
        return arch, "the device tree's SoC (no CUDA device: {})".format(first_line(exc))


def _sass_serves(entry: Dict[str, Any], arch: str, driver: Optional[int]) -> bool:
    """Whether a prebuilt binary has SASS for GPU `arch` that loads under a driver of CUDA major `driver`
    (None: unknown): SASS of one major version on that major's drivers."""
    return arch in entry["targets"] and driver in (None, entry["driver"])


def _serves(entry: Dict[str, Any], arch: str, driver: Optional[int]) -> bool:
    """Whether a prebuilt binary can load for GPU `arch` under a driver of CUDA major `driver` (None: unknown):
    its SASS, or its PTX (compute_XY), which also runs on later majors and GPUs."""
    ptx = [int(t[len("compute_"):]) for t in entry["targets"] if t.startswith("compute_")]
    if _sass_serves(entry, arch, driver):
        return True
    return (driver is None or driver >= entry["driver"]) and any(p <= int(arch[len("sm_"):]) for p in ptx)


def _load_order(entry: Dict[str, Any], arch: str, driver: Optional[int]) -> Tuple[int, int]:
    """SASS before PTX (a 12.x PTX must not be JIT-compiled where the 13.x fatbin's SASS loads); newest PTX first."""
    return (0, 0) if _sass_serves(entry, arch, driver) else (1, -entry["driver"])


def describe(entry: Dict[str, Any]) -> str:
    return "shipped edge/cuda/{} ({}: {}, for CUDA {}.x drivers)".format(
        entry["file"], entry["toolkit"], ", ".join(entry["targets"]), entry["driver"])


def prebuilt_summary() -> str:
    """What is shipped, per driver family, for `edge doctor`; stale ones named as such."""
    current = source_sha256()
    return "; ".join("CUDA {}.x: {} ({}, {}){}".format(
        k["driver"], k["file"], k["toolkit"], ", ".join(k["targets"]),
        "" if k.get("source_sha256") == current else " STALE: other sources") for k in prebuilt()) or "none"


def candidates(arch: str, driver: Optional[int] = None) -> Tuple[List[Tuple[str, str]], List[str]]:
    """([(path, where from)] in load order, [why other places have none]) for GPU `arch` under a driver of CUDA
    major version `driver` (None: unknown, every family tried)."""
    found = sorted(glob.glob(os.path.join(kernel_dir(), cubin_name(arch, "*"))), reverse=True)
    missing = [] if found else ["no {} kernel in {} (build it: scripts/build_kernel.py)".format(arch, kernel_dir())]
    paths = [(p, p) for p in found]
    current = source_sha256()
    serving = sorted((k for k in prebuilt() if _serves(k, arch, driver)), key=lambda k: _load_order(k, arch, driver))
    for entry in serving:
        path = os.path.join(CUDA_DIR, entry["file"])
        if entry.get("source_sha256") != current or not os.path.isfile(path):
            missing.append("{} is stale or missing (regenerate: scripts/build_kernel.py --prebuilt)".format(
                describe(entry)))
        else:
            paths.append((path, describe(entry)))
    if len(paths) == len(found):
        missing.append("no prebuilt kernel for {} under a CUDA {} driver".format(
            arch, "{}.x".format(driver) if driver is not None else "(unknown)"))
    return paths, missing


def driver_major(drv: Any) -> Optional[int]:
    """12 for a CUDA 12.6 driver (12060), None when the driver does not say."""
    try:
        return int(drv.get_driver_version()) // 1000
    except Exception:  # pycuda's Error, or a driver API that is not there
        return None


def load_kernel(drv: Any, arch: str) -> Tuple[Any, str]:
    """(pycuda module, where it came from): the first candidate that loads with both kernels; the context
    must be current. KernelUnavailable names every place tried and why it failed."""
    paths, problems = candidates(arch, driver_major(drv))
    for path, where in paths:
        try:
            with open(path, "rb") as fh:  # PTX is text: the driver reads it up to a NUL
                module = drv.module_from_buffer(fh.read() + (b"\0" if path.endswith(".ptx") else b""))
            for name in KERNELS:
                module.get_function(name)
            return module, where
        except Exception as exc:  # OSError, pycuda's LogicError/RuntimeError (no image for this GPU, driver too old)
            problems.append("{}: {}".format(where, first_line(exc)))
    raise KernelUnavailable("no loadable preprocessing kernel for {}: {}".format(arch, "; ".join(problems)))
