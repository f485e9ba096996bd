"""edge.model.prebuilt_kernels without its registry: each driver family's pinned wheels and targets are what the
shipped kernels record having been built from, and the wheels unpack to the NVRTC library and CUDA headers
folders the build reads. (The byte-for-byte rebuild from PyPI: tests/test_kernel_aot.py.)"""

import os
import zipfile

from edge.infer import cuda_kernel
from edge.model.prebuilt_kernels import FAMILIES, unpack


def test_each_familys_pinned_toolkit_and_targets_are_what_its_shipped_kernels_record():
    shipped = [k for k in cuda_kernel.prebuilt() if k["toolkit"].startswith("NVRTC ")]
    assert {k["driver"] for k in shipped} == set(FAMILIES)
    for family, (wheels, targets) in FAMILIES.items():
        mine = [k for k in shipped if k["driver"] == family]
        version = ".".join(wheels[0].split("==")[1].split(".")[:2])  # the NVRTC a wheel holds: 11.8.89 -> 11.8
        assert {k["toolkit"] for k in mine} == {"NVRTC {} ({})".format(version, wheels[0])}
        assert sorted(t for k in mine for t in k["targets"]) == sorted(targets)
        assert sorted(k["file"] for k in mine) == sorted("preprocess-cuda{}-{}.{}".format(
            version, arch, "ptx" if arch.startswith("compute_") else "cubin") for arch in targets)
        assert all(w.split("==")[1] == wheels[0].split("==")[1] for w in wheels)  # NVRTC and headers of one CUDA


def test_the_wheels_unpack_to_the_nvrtc_library_and_the_headers_folders(tmp_path):
    for wheel, member in (("nvrtc.whl", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"),
                          ("runtime.whl", "nvidia/cuda_runtime/include/cuda_fp16.h")):
        with zipfile.ZipFile(str(tmp_path / wheel), "w") as zf:
            zf.writestr(member, b"x")
    lib_dir, include = unpack(str(tmp_path), str(tmp_path / "unpacked"))
    assert os.path.isfile(os.path.join(lib_dir, "libnvrtc.so.12"))
    assert os.path.isfile(os.path.join(include, "cuda_fp16.h"))
