"""The preprocessing kernel prebuilt for the CUDA 11.x and 12.x driver families (JetPack 5 and 6), from registry
toolchains: NVRTC and the CUDA headers of PyPI's nvidia-cuda-nvrtc-cuNN / nvidia-cuda-runtime-cuNN wheels, pinned
below, compiled to SASS (cubin) per GPU, and to PTX (compute_XY, JIT-compiled by any later driver) where listed.
The 12.x family is built by 12.2, JetPack 6's first and oldest CUDA: a driver runs what an older or equal toolkit
built, so it leans on no minor-version compatibility (undocumented for L4T). 11.8 is newer than JetPack 5's 11.4
(no 11.4 NVRTC wheel exists): docs/gpu.md marks it unverified on L4T. The 13.x family's fatbin is nvcc 13's
(edge.infer.cuda_kernel.build_fatbin).

    scripts/build_kernel.py --prebuilt      # pip downloads the pinned wheels, NVRTC builds, prebuilt.json records

NVRTC (not nvcc: PyPI's nvidia-cuda-nvcc-cu11/-cu12 wheels hold ptxas and libnvvm but no nvcc or cicc) compiles the
same preprocess.cu and preprocess.cuh as nvcc; its output is deterministic for one version (a rebuild is
byte-identical, tests/test_kernel_aot.py). Runs on the build machine only (x86_64 Linux wheels), never on a device.
"""

import ctypes
import glob
import os
import subprocess
import sys
import zipfile
from typing import Any, Dict, List, Tuple

from edge.errors import EXIT_FAIL, EdgeError
from edge.infer.cuda_kernel import CUDA_DIR, CXX_FLAGS, PREBUILT, record_prebuilt
from edge.store.fileio import atomic_write, temp_dir

# driver family -> (the wheels of its toolkit, its targets: SASS for the GPUs of that JetPack, Xavier sm_72 and Orin
# sm_87 on JetPack 5; PTX for Orin on JetPack 6, which a 12.x driver newer than 12.2 may JIT instead)
FAMILIES: Dict[int, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    11: (("nvidia-cuda-nvrtc-cu11==11.8.89", "nvidia-cuda-runtime-cu11==11.8.89"), ("sm_72", "sm_87")),
    12: (("nvidia-cuda-nvrtc-cu12==12.2.140", "nvidia-cuda-runtime-cu12==12.2.140"), ("sm_87", "compute_87")),
}


def download(wheels: Tuple[str, ...], folder: str) -> None:
    """The pinned x86_64 wheels, by pip (the registry's own client)."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--platform",
           "manylinux2014_x86_64", "--python-version", "3.8", "--dest", folder] + list(wheels)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, encoding="utf-8", errors="replace")
    if proc.returncode != 0:
        raise EdgeError("pip download {} failed: {}".format(" ".join(wheels), proc.stdout.strip()[-300:]),
                        exit_code=EXIT_FAIL)


def unpack(folder: str, into: str) -> Tuple[str, str]:
    """(folder of libnvrtc, include folder with cuda_fp16.h) from the downloaded wheels."""
    for wheel in glob.glob(os.path.join(folder, "*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(into)
    return os.path.join(into, "nvidia", "cuda_nvrtc", "lib"), os.path.join(into, "nvidia", "cuda_runtime", "include")


class Nvrtc:
    """libnvrtc through ctypes: the version, and preprocess.cu compiled to a cubin for one GPU (sm_XY) or to PTX
    for one virtual architecture (compute_XY)."""

    def __init__(self, lib_dir: str):
        for builtins in glob.glob(os.path.join(lib_dir, "libnvrtc-builtins.so*")):  # libnvrtc dlopens it
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
        self.lib: Any = ctypes.CDLL(glob.glob(os.path.join(lib_dir, "libnvrtc.so*"))[0])
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = "{}.{}".format(major.value, minor.value)

    def _check(self, result: int, what: str, prog: Any = None) -> None:
        if result == 0:
            return
        log = ""
        if prog is not None:
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            text = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, text)
            log = ": " + " ".join(text.value.decode(errors="replace").split())[:500]
        raise EdgeError("NVRTC {} {} failed (error {}){}".format(self.version, what, result, log), exit_code=EXIT_FAIL)

    def compile(self, arch: str, include: str) -> bytes:
        with open(os.path.join(CUDA_DIR, "preprocess.cu"), "rb") as fh:
            source = fh.read()
        with open(os.path.join(CUDA_DIR, "preprocess.cuh"), "rb") as fh:
            header = fh.read()
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source, b"preprocess.cu", 1,
                                                (ctypes.c_char_p * 1)(header),
                                                (ctypes.c_char_p * 1)(b"preprocess.cuh")), "create")
        try:
            options = [("--gpu-architecture=" + arch).encode(), ("-I" + include).encode()] + \
                [flag.replace("-std", "--std").encode() for flag in CXX_FLAGS]
            self._check(self.lib.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options)),
                        "compile for " + arch, prog)
            kind = "PTX" if arch.startswith("compute_") else "CUBIN"
            size = ctypes.c_size_t()
            self._check(getattr(self.lib, "nvrtcGet{}Size".format(kind))(prog, ctypes.byref(size)), kind + " size")
            image = ctypes.create_string_buffer(size.value)
            self._check(getattr(self.lib, "nvrtcGet" + kind)(prog, image), kind)
            return image.raw.rstrip(b"\0") if kind == "PTX" else image.raw  # PTX as a text file, without its NUL
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def build_prebuilt(families: Tuple[int, ...] = tuple(FAMILIES), out_dir: str = CUDA_DIR,
                   record: str = PREBUILT) -> List[Dict[str, Any]]:
    """Each family's cubins and PTX into `out_dir`, each recorded in `record`; the entries written."""
    entries = []
    with temp_dir(out_dir, ".toolchain-") as work:
        for family in families:
            wheels, archs = FAMILIES[family]
            folder = os.path.join(work, str(family))
            download(wheels, folder)
            lib_dir, include = unpack(folder, os.path.join(folder, "unpacked"))
            nvrtc = Nvrtc(lib_dir)
            for arch in archs:
                path = os.path.join(out_dir, "preprocess-cuda{}-{}.{}".format(
                    nvrtc.version, arch, "ptx" if arch.startswith("compute_") else "cubin"))
                image = nvrtc.compile(arch, include)
                atomic_write(path, lambda fh, image=image: fh.write(image), "kernel")
                entries.append(record_prebuilt({"file": os.path.basename(path), "driver": family,
                                                "toolkit": "NVRTC {} ({})".format(nvrtc.version, wheels[0]),
                                                "targets": [arch]}, path, record))
    return entries
