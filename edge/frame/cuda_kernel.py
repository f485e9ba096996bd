"""The preprocessing kernel's binary: compiled ahead of time by nvcc, never by the service; loaded at start.

`load_kernel` tries, in order, and returns the first module the driver loads with both kernels:
  1. <kernel dir>/preprocess-sm_XY-cudaA.B-<source hash>.cubin: built on the device for its GPU by its own
     nvcc (`scripts/build_kernel.py`; scripts/install_service.sh runs it into /var/lib/jetson-edge/kernels);
  2. edge/cuda/preprocess.fatbin, shipped in the package: SASS for sm_87 (Orin) and sm_110 (Thor) plus
     compute_110 PTX, built by `scripts/build_kernel.py --fatbin`; preprocess.fatbin.json records the hash of
     the sources it came from (tests/test_kernel_aot.py checks it is current).
Kernel dir: $EDGE_KERNEL_DIR, else $STATE_DIRECTORY/kernels (inside the unit), else /var/lib/jetson-edge/kernels
(the installed service's state directory): the CLI, `edge doctor` and the service find the same kernel. nvcc's
temporary files go to a private folder inside the output folder, so an unwritable /tmp does not matter; nvcc's own
message is kept in the error.
"""

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Tuple

from edge.errors import EXIT_FAIL, EdgeError, first_line, require
from edge.fileio import temp_dir, write_json_atomic

CUDA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda")
SOURCES = ("preprocess.cu", "preprocess.cuh")
KERNELS = ("edge_preprocess_f32", "edge_preprocess_f16")
FATBIN = os.path.join(CUDA_DIR, "preprocess.fatbin")
FATBIN_INFO = FATBIN + ".json"
FATBIN_TARGETS = ("arch=compute_87,code=sm_87", "arch=compute_110,code=[sm_110,compute_110]")
_FLAGS = ("-std=c++14",)
SERVICE_KERNEL_DIR = "/var/lib/jetson-edge/kernels"  # the unit's StateDirectory=jetson-edge, + kernels


class KernelUnavailable(EdgeError):
    """No kernel binary loads on this GPU (exit 2 when preprocess.device is cuda; `auto` uses the CPU)."""


def source_sha256() -> str:
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
                         universal_newlines=True).stdout
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
        cmd = [nvcc, *_FLAGS, *args, "-I", CUDA_DIR, "-o", staged, os.path.join(CUDA_DIR, "preprocess.cu")]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
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


def build_fatbin(nvcc: Optional[str] = None, out: str = FATBIN) -> Dict[str, Any]:
    """Regenerate the shipped fatbin and its record (deterministic for one nvcc version)."""
    nvcc = nvcc or find_nvcc()
    args = ["--fatbin"] + [a for target in FATBIN_TARGETS for a in ("-gencode", target)]
    run_nvcc(nvcc, args, out)
    info = {"source_sha256": source_sha256(), "nvcc": nvcc_version(nvcc), "nvcc_args": list(_FLAGS) + args}
    write_json_atomic(out + ".json", info, "fatbin record")
    return info


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


def fatbin_current() -> Optional[str]:
    """None when the shipped fatbin matches the sources, else why it cannot be used."""
    try:
        with open(FATBIN_INFO, "r", encoding="utf-8") as fh:
            recorded = json.load(fh).get("source_sha256")
    except (OSError, ValueError):
        return "no shipped fatbin ({})".format(os.path.basename(FATBIN_INFO))
    if not os.path.isfile(FATBIN):
        return "no shipped fatbin ({})".format(os.path.basename(FATBIN))
    if recorded != source_sha256():
        return "shipped fatbin is stale (other sources; regenerate: scripts/build_kernel.py --fatbin)"
    return None


def candidates(arch: str) -> Tuple[List[Tuple[str, str]], List[str]]:
    """([(path, where from)] in load order, [why other places have none])."""
    found = sorted(glob.glob(os.path.join(kernel_dir(), cubin_name(arch, "*"))), reverse=True)
    missing = [] if found else ["no {} kernel in {} (build it: scripts/build_kernel.py)".format(arch, kernel_dir())]
    paths = [(p, p) for p in found]
    stale = fatbin_current()
    if stale is None:
        paths.append((FATBIN, "shipped " + os.path.relpath(FATBIN, os.path.dirname(os.path.dirname(CUDA_DIR)))))
    else:
        missing.append(stale)
    return paths, missing


def load_kernel(drv: Any, arch: str) -> Tuple[Any, str]:
    """(pycuda module, where it came from): the first candidate that loads with both kernels; the context
    must be current. KernelUnavailable names every place tried and why it failed."""
    paths, problems = candidates(arch)
    for path, where in paths:
        try:
            with open(path, "rb") as fh:
                module = drv.module_from_buffer(fh.read())
            for name in KERNELS:
                module.get_function(name)
            return module, where
        except Exception as exc:  # OSError, pycuda's LogicError/RuntimeError (no image for this GPU, driver too old)
            problems.append("{}: {}".format(where, first_line(exc)))
    raise KernelUnavailable("no loadable preprocessing kernel for {}: {}".format(arch, "; ".join(problems)))
