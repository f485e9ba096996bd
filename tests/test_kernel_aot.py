"""The preprocessing kernel is built ahead of time (edge/infer/cuda_kernel.py, scripts/build_kernel.py).

- A kernel prebuilt for each driver family (edge/cuda/prebuilt.json): current (the recorded hash of today's sources,
  whose math the host build checks against the CPU: tests/test_cuda_host_math.py), SASS for its GPU (or PTX for
  its virtual architecture) with both kernels, and what its toolchain builds: NVRTC from PyPI's pinned wheels (11.8,
  12.2) and nvcc 13 (the 13.x fatbin) rebuild each byte for byte. The driver's CUDA major version picks among them,
  after the device's own build, SASS before PTX.
- Defect 1's conditions without a GPU: the build step as an unprivileged user with an unwritable /tmp
  (a read-only tmpfs over /tmp in a private mount namespace) still builds into the state directory, where
  plain nvcc fails; nvcc's own message is kept in a failure.
"""

import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from edge.infer import cuda_kernel
from edge.store.artifact import sha256_file

ROOT = Path(__file__).resolve().parent.parent
NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.isfile(p)), None)
NOBODY = 65534
DROP = ["setpriv", "--reuid={}".format(NOBODY), "--regid={}".format(NOBODY), "--clear-groups",
        "env", "HOME=/nonexistent"]


@pytest.fixture(scope="module")
def nvcc() -> str:
    if NVCC is None:
        pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin)")
    return NVCC


# Each driver family's prebuilt kernel (edge/cuda/prebuilt.json): JetPack 5 (CUDA 11.x) Xavier and Orin, JetPack 6
# (12.x) Orin, SASS and PTX, JetPack 7 (13.x) Orin and Thor.
FAMILIES = {11: {"sm_72", "sm_87"}, 12: {"sm_87", "compute_87"}, 13: {"sm_87", "sm_110", "compute_110"}}
PTX_12 = "preprocess-cuda12.2-compute_87.ptx"
EM_CUDA = 190


def test_prebuilt_kernels_are_current_and_cover_each_driver_family() -> None:
    entries = cuda_kernel.prebuilt()
    served: Dict[int, set] = {}
    for entry in entries:
        path = os.path.join(cuda_kernel.CUDA_DIR, entry["file"])
        assert entry["source_sha256"] == cuda_kernel.source_sha256(), "stale: scripts/build_kernel.py --prebuilt"
        assert entry["sha256"] == sha256_file(path)
        served.setdefault(entry["driver"], set()).update(entry["targets"])
    assert served == FAMILIES
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert all('"cuda/*.{}"'.format(ext) in setup for ext in ("cubin", "fatbin", "ptx"))
    assert all(" *.{}".format(ext) in (ROOT / "MANIFEST.in").read_text(encoding="utf-8")
               for ext in ("cubin", "fatbin", "ptx"))


def test_the_12x_family_is_built_by_jetpack_6s_first_cuda() -> None:
    """CUDA 12.2 (JetPack 6.0) builds it, so no 12.x driver on L4T runs a binary newer than itself."""
    for entry in (k for k in cuda_kernel.prebuilt() if k["driver"] == 12):
        assert entry["toolkit"].startswith("NVRTC 12.2 ") and "-cuda12.2-" in entry["file"]
        data = (Path(cuda_kernel.CUDA_DIR) / entry["file"]).read_bytes()
        if data[:4] == b"\x7fELF":
            assert struct.unpack_from("<I", data, 20)[0] == 122  # the cubin's e_version: its compiler, CUDA 12.2


@pytest.mark.parametrize("entry", [k for k in cuda_kernel.prebuilt() if k["file"].endswith(".cubin")],
                         ids=lambda k: k["file"])
def test_each_cubin_is_sass_for_its_gpu_with_both_kernels(entry: Dict[str, Any]) -> None:
    data = (Path(cuda_kernel.CUDA_DIR) / entry["file"]).read_bytes()
    machine, = struct.unpack_from("<H", data, 18)
    flags, = struct.unpack_from("<I", data, 48)
    (target,) = entry["targets"]
    assert data[:4] == b"\x7fELF" and machine == EM_CUDA
    assert flags & 0xFF == int(target[len("sm_"):])  # the SASS's SM
    for name in cuda_kernel.KERNELS:  # extern "C": the names pycuda looks up
        assert name.encode() + b"\0" in data


def test_the_ptx_is_for_orin_with_both_kernels() -> None:
    text = (Path(cuda_kernel.CUDA_DIR) / PTX_12).read_text(encoding="ascii")
    assert "Cuda compilation tools, release 12.2," in text and "\n.version 8.2\n" in text  # ISA a 12.2 driver JITs
    assert "\n.target sm_87\n" in text and "\0" not in text
    for name in cuda_kernel.KERNELS:
        assert ".entry {}(".format(name) in text


def test_prebuilt_cubins_are_what_the_registry_toolchains_build(tmp_path: Path) -> None:
    """NVRTC from PyPI's pinned wheels, downloaded by pip, rebuilds each shipped cubin byte for byte."""
    from edge.model.prebuilt_kernels import build_prebuilt

    try:
        entries = build_prebuilt(out_dir=str(tmp_path), record=str(tmp_path / "prebuilt.json"))
    except cuda_kernel.EdgeError as exc:
        if "pip download" in str(exc):
            pytest.skip("PyPI not reachable for the NVRTC wheels: {}".format(exc))
        raise
    shipped = {k["file"]: k for k in cuda_kernel.prebuilt()}
    assert entries and {e["file"] for e in entries} == {f for f, k in shipped.items() if k["toolkit"][:6] == "NVRTC "}
    assert PTX_12 in shipped
    for entry in entries:
        assert entry == shipped[entry["file"]]
        assert (tmp_path / entry["file"]).read_bytes() == (Path(cuda_kernel.CUDA_DIR) / entry["file"]).read_bytes()


def test_shipped_fatbin_is_what_nvcc_builds(nvcc: str, tmp_path: Path) -> None:
    recorded = next(k for k in cuda_kernel.prebuilt() if k["file"] == "preprocess.fatbin")
    if "nvcc " + cuda_kernel.nvcc_version(nvcc) != recorded["toolkit"]:
        pytest.skip("nvcc {} here, the fatbin was built by {}".format(cuda_kernel.nvcc_version(nvcc),
                                                                       recorded["toolkit"]))
    out = str(tmp_path / "preprocess.fatbin")
    assert cuda_kernel.build_fatbin(nvcc, out, str(tmp_path / "prebuilt.json")) == recorded
    assert Path(out).read_bytes() == Path(cuda_kernel.FATBIN).read_bytes()


@pytest.mark.parametrize("arch,driver,chosen", [
    ("sm_72", 11, ["preprocess-cuda11.8-sm_72.cubin"]),  # Xavier, JetPack 5
    ("sm_87", 11, ["preprocess-cuda11.8-sm_87.cubin"]),  # Orin, JetPack 5
    ("sm_87", 12, ["preprocess-cuda12.2-sm_87.cubin", PTX_12]),  # Orin, JetPack 6: SASS, then the PTX
    ("sm_87", 13, ["preprocess.fatbin", PTX_12]),  # Orin, JetPack 7: the fatbin's SASS before the 12.2 PTX
    ("sm_110", 13, ["preprocess.fatbin", PTX_12]),  # Thor
    ("sm_110", 14, ["preprocess.fatbin", PTX_12]),  # a later driver: PTX only, the newest (compute_110) first
    ("sm_87", 14, [PTX_12]),  # SASS does not cross majors, PTX for 11.0 does not run on 8.7: the 8.7 PTX
    ("sm_72", 12, []),  # no Xavier on JetPack 6
    ("sm_87", None, ["preprocess-cuda11.8-sm_87.cubin", "preprocess-cuda12.2-sm_87.cubin", "preprocess.fatbin",
                     PTX_12]),
])
def test_the_driver_version_chooses_the_prebuilt_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str,
                                                        driver: Optional[int], chosen: List[str]) -> None:
    monkeypatch.setenv("EDGE_KERNEL_DIR", str(tmp_path))
    (tmp_path / cuda_kernel.cubin_name(arch, "12.6")).write_bytes(b"\x7fELF built here")
    paths, missing = cuda_kernel.candidates(arch, driver)
    assert paths[0][0] == str(tmp_path / cuda_kernel.cubin_name(arch, "12.6"))  # the device's own build first
    assert [os.path.basename(p) for p, _ in paths[1:]] == chosen
    if not chosen:
        assert missing == ["no prebuilt kernel for {} under a CUDA {} driver".format(
            arch, "{}.x".format(driver) if driver is not None else "(unknown)")]
    else:
        assert all(w.startswith("shipped edge/cuda/") and "for CUDA" in w for _, w in paths[1:])


class PtxDriver:
    """pycuda.driver's part that load_kernel uses: a CUDA 14.x driver that takes NUL-terminated PTX only."""

    def __init__(self) -> None:
        self.images: List[bytes] = []

    def get_driver_version(self) -> int:
        return 14000

    def module_from_buffer(self, image: bytes) -> Any:
        self.images.append(image)
        if not (image.startswith(b"//") and image.endswith(b"\0")):
            raise RuntimeError("cuModuleLoadData failed: device kernel image is invalid")
        return self

    def get_function(self, name: str) -> str:
        return name


def test_ptx_is_handed_to_the_driver_nul_terminated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cuModuleLoadData reads PTX up to its NUL; the shipped file is plain text without one."""
    monkeypatch.setenv("EDGE_KERNEL_DIR", str(tmp_path))
    drv = PtxDriver()
    _, where = cuda_kernel.load_kernel(drv, "sm_87")
    assert PTX_12 in where and len(drv.images) == 1
    assert drv.images[0] == (Path(cuda_kernel.CUDA_DIR) / PTX_12).read_bytes() + b"\0"


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory outside /tmp (which gets covered), owned by nobody like /var/lib/jetson-edge."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the build as nobody")
    top = Path(tempfile.mkdtemp(prefix="edge-state-", dir="/var/tmp"))
    os.chmod(str(top), 0o755)
    (top / "kernels").mkdir()
    os.chown(str(top / "kernels"), NOBODY, NOBODY)
    yield top / "kernels"
    shutil.rmtree(str(top))


def as_nobody_without_tmp(command: List[str]) -> "subprocess.CompletedProcess[str]":
    """`command` as nobody, with a read-only /tmp: a private mount namespace where it can be made, else TMPDIR."""
    drop = DROP + ["PATH=" + os.environ.get("PATH", "/usr/bin:/bin")]
    readonly = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o ro tmpfs /tmp"],
                              stderr=subprocess.DEVNULL).returncode == 0 if shutil.which("unshare") else False
    if readonly and os.path.isdir("/mnt"):
        # the checkout may itself live under /tmp (CI clones there): it is bound to /mnt before /tmp is hidden
        script = ('mount --bind "$0" /mnt && mount -t tmpfs -o ro tmpfs /tmp && cd /mnt '
                  '&& ! touch /tmp/probe 2>/dev/null && exec "$@"')
        moved = ["/mnt" + arg[len(str(ROOT)):] if arg.startswith(str(ROOT) + "/") else arg for arg in command]
        full = ["unshare", "-m", "sh", "-c", script, str(ROOT)] + drop + ["TMPDIR=/tmp"] + moved
    else:
        empty = tempfile.mkdtemp(dir="/var/tmp")
        os.chmod(empty, 0o555)
        full = drop + ["TMPDIR=" + empty] + command
    return subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, encoding="utf-8", errors="replace",
                          cwd=str(ROOT))


def python_for_nobody() -> str:
    """An interpreter nobody may run that imports what the build script needs (a venv under /root is not)."""
    for python in (sys.executable, "/usr/bin/python3"):
        if subprocess.run(DROP + [python, "-c", "import numpy, yaml"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, cwd=str(ROOT)).returncode == 0:
            return python
    pytest.skip("no Python with numpy and yaml that the user nobody may run")


def test_build_as_nobody_with_unwritable_tmp(nvcc: str, state_dir: Path) -> None:
    plain = as_nobody_without_tmp([nvcc, "--cubin", "-arch", "sm_87", "-o", str(state_dir / "plain.cubin"),
                                   str(ROOT / "edge" / "cuda" / "preprocess.cu")])
    assert plain.returncode != 0 and "Could not open output file" in plain.stdout, plain.stdout  # defect 1
    proc = as_nobody_without_tmp([python_for_nobody(), "scripts/build_kernel.py", "--arch", "sm_87",
                                  "--into", str(state_dir)])
    assert proc.returncode == 0, proc.stdout
    (built,) = [p for p in os.listdir(str(state_dir))]
    assert built == cuda_kernel.cubin_name("sm_87", ".".join(cuda_kernel.nvcc_version(nvcc).split(".")[:2]))
    assert (state_dir / built).read_bytes()[:4] == b"\x7fELF" and (state_dir / built).stat().st_uid == NOBODY


def test_nvcc_message_is_kept(nvcc: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "scripts/build_kernel.py", "--arch", "sm_10", "--into", str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          encoding="utf-8", errors="replace", cwd=str(ROOT))
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "build_kernel.py: error: nvcc failed on edge/cuda/preprocess.cu (--cubin -arch sm_10): " in proc.stderr
    assert "sm_10" in proc.stderr.split("): ", 1)[1]  # nvcc's own words
    assert os.listdir(str(tmp_path)) == []  # nothing half-written


@pytest.mark.parametrize("compatible,arch", [
    ("nvidia,p3509-0000+p3668-0000\0nvidia,p3668-0000\0nvidia,tegra194\0", "sm_72"),  # Xavier NX
    ("nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0nvidia,tegra234\0", "sm_87"),  # Orin Nano
    ("nvidia,p3971-0089+p3834-0008\0nvidia,p3834-0008\0nvidia,tegra264\0", "sm_110"),  # Thor
    (None, None),  # not a device-tree machine
])
def test_without_a_cuda_device_the_kernel_is_built_for_the_soc_the_device_tree_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_gpu: None, compatible: str, arch: str) -> None:
    """An install in an image build or a chroot has no CUDA device: the Jetson's SoC says which GPU it has."""
    from edge import board

    if compatible is not None:
        folder = tmp_path / "sys/firmware/devicetree/base"
        folder.mkdir(parents=True)
        (folder / "compatible").write_text(compatible, encoding="utf-8")
    assert board.tegra_arch(str(tmp_path)) == arch
    real = board.tegra_arch
    monkeypatch.setattr(board, "tegra_arch", lambda root="/": real(str(tmp_path)))
    if arch is None:
        with pytest.raises(cuda_kernel.EdgeError, match="no CUDA device to build the kernel for"):
            cuda_kernel.device_arch()
    else:  # no CUDA device (no_gpu): the device tree decides
        found, why = cuda_kernel.device_arch()
        assert found == arch and why.startswith("the device tree's SoC (no CUDA device")
