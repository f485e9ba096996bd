"""nvcc compiles the preprocessing kernel for Orin (sm_87) and Thor (sm_110), C++14, warnings as errors."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CUDA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "edge", "cuda")
NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.isfile(p)), None)
STRICT = ["-std=c++14", "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror"]


@pytest.fixture(scope="module")
def nvcc() -> str:
    if NVCC is None:
        print("SKIP reason: nvcc not found (PATH, /usr/local/cuda/bin)")
        pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin)")
    return NVCC


def compile_kernel(nvcc: str, out: str, *flags: str) -> None:
    cmd = [nvcc, *STRICT, *flags, "-o", out, os.path.join(CUDA_DIR, "preprocess.cu")]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, encoding="utf-8", errors="replace")
    assert proc.returncode == 0, " ".join(cmd) + "\n" + proc.stdout


@pytest.mark.parametrize("arch", ["87", "110"])
def test_cubin_per_arch(nvcc: str, tmp_path: Path, arch: str) -> None:
    out = os.path.join(str(tmp_path), "preprocess_sm{}.cubin".format(arch))
    compile_kernel(nvcc, out, "--cubin", "-gencode", "arch=compute_{0},code=sm_{0}".format(arch))
    assert os.path.getsize(out) > 0


def test_object_with_host_pass(nvcc: str, tmp_path: Path) -> None:
    """-c also runs the host compiler over the file (with -Wall -Wextra -Werror); PTX kept for newer GPUs."""
    out = os.path.join(str(tmp_path), "preprocess.o")
    compile_kernel(nvcc, out, "-c", "-gencode", "arch=compute_87,code=[sm_87,compute_87]",
                   "-gencode", "arch=compute_110,code=sm_110")
    assert os.path.getsize(out) > 0


def test_ptx_exports_both_kernels(nvcc: str, tmp_path: Path) -> None:
    out = os.path.join(str(tmp_path), "preprocess.ptx")
    compile_kernel(nvcc, out, "--ptx", "-arch=compute_87")
    with open(out, encoding="utf-8") as fh:
        ptx = fh.read()
    for kernel in ("edge_preprocess_f32", "edge_preprocess_f16"):  # extern "C": names pycuda looks up
        assert ".entry {}(".format(kernel) in ptx
