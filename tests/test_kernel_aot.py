"""The preprocessing kernel is built ahead of time (edge/frame/cuda_kernel.py, scripts/build_kernel.py).

- The shipped fatbin is current: built from today's sources (recorded hash) and, with the nvcc that built it,
  byte-identical to a fresh build (nvcc's fatbin output is deterministic and path-independent).
- Defect 1's conditions without a GPU: the build step as an unprivileged user with an unwritable /tmp
  (a read-only tmpfs over /tmp in a private mount namespace) still builds into the state directory, where
  plain nvcc fails; nvcc's own message is kept in a failure.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List

import pytest

from edge.frame import cuda_kernel

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


def test_shipped_fatbin_matches_the_sources() -> None:
    assert cuda_kernel.fatbin_current() is None, "regenerate: scripts/build_kernel.py --fatbin"
    assert "cuda/*.fatbin" in (ROOT / "setup.py").read_text()  # shipped in the package


def test_shipped_fatbin_is_what_nvcc_builds(nvcc: str, tmp_path: Path) -> None:
    with open(cuda_kernel.FATBIN_INFO) as fh:
        recorded = json.load(fh)
    if cuda_kernel.nvcc_version(nvcc) != recorded["nvcc"]:
        pytest.skip("nvcc {} here, the fatbin was built by {}".format(cuda_kernel.nvcc_version(nvcc),
                                                                       recorded["nvcc"]))
    out = str(tmp_path / "preprocess.fatbin")
    assert cuda_kernel.build_fatbin(nvcc, out) == recorded
    assert Path(out).read_bytes() == Path(cuda_kernel.FATBIN).read_bytes()


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
    return subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
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
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, cwd=str(ROOT))
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
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compatible: str, arch: str) -> None:
    """An install in an image build or a chroot has no CUDA device: the Jetson's SoC says which GPU it has."""
    from edge import board

    if compatible is not None:
        folder = tmp_path / "sys/firmware/devicetree/base"
        folder.mkdir(parents=True)
        (folder / "compatible").write_text(compatible)
    assert board.tegra_arch(str(tmp_path)) == arch
    real = board.tegra_arch
    monkeypatch.setattr(board, "tegra_arch", lambda root="/": real(str(tmp_path)))
    if arch is None:
        with pytest.raises(cuda_kernel.EdgeError, match="no CUDA device to build the kernel for"):
            cuda_kernel.device_arch()
    else:  # this machine has no CUDA device (nor pycuda): the device tree decides
        found, why = cuda_kernel.device_arch()
        assert found == arch and why.startswith("the device tree's SoC (no CUDA device")
