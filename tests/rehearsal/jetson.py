"""A Jetson-shaped Debian root for tests/test_rehearsal.py: the stubs the tests own for what only a Jetson (or
NVIDIA's apt repository) has, laid into a debootstrapped root before it boots, and the mounts made in its mount
namespace after each boot.

In the root (a JetPack 6 board, an Orin Nano 8GB):
  /etc/nv_tegra_release            R36.4.3
  /etc/nvpmodel.conf               tests/nvpmodel/orin_nano_8gb_super_r36.conf; /usr/sbin/nvpmodel answers -q, -p, -m
  /usr/bin/jetson_clocks, /usr/bin/tegrastats   stand-ins (jtop needs the first at that path)
  /usr/local/cuda -> cuda-12.6     empty, as a minimal flash leaves it
  /usr/lib/.../libcuda.so.1        not stubbed: pycuda is (below), so nothing links it
  /opt/rehearsal/apt               a local apt repository of empty or tiny packages NVIDIA's repository has
                                   (python3-libnvinfer, cuda-nvcc-12-6 whose nvcc runs this machine's nvcc,
                                   cuda-cudart-dev-12-6, libcurand-dev-12-6, cuda-profiler-api-12-6)
  /opt/rehearsal/wheels            pycuda as a stand-in wheel: a driver with no CUDA device (cuInit fails), as on
                                   a Jetson whose GPU is out of reach; found by root's pip (~/.config/pip)
  /usr/lib/.../gstreamer-1.0/python   nvv4l2decoder and nvvidconv as Python elements with software inside (the
                                   camera's pipeline on a Jetson names them; loaded once the test installs
                                   Debian's Python plugin loader with the camera's plugins)
  /fake_sys, /opt/rehearsal/jtop   jetson-stats' testing-mode sysfs (tests/service_jtop.py), and a jtop.service
                                   drop-in of the tests that sets JTOP_TESTING (jtop.service runs the venv's jtop
                                   through the product's own drop-in)
Mounted in its namespace at each boot, before systemd starts (ROOT.preboot, run by rehearsal.sh): the CUDA toolkit
at /opt/host-cuda (read-only), the fake /sys/devices/virtual (dmi, thermal zones) and a device tree
(/sys/firmware/devicetree/base: an Orin Nano).
"""

import base64
import ctypes
import hashlib
import io
import os
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import Dict, List, Optional

import service_jtop

TESTS = Path(__file__).resolve().parent.parent
L4T = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 2025\n"
CUDA = "12.6"
MODEL = "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"
COMPATIBLE = "nvidia,p3768-0000+p3767-0005-super\0nvidia,p3767-0005\0nvidia,tegra234\0"

NVPMODEL = r"""#!/bin/sh
# nvpmodel stand-in (tests/rehearsal): the modes of /etc/nvpmodel.conf; the current one in /var/lib/nvpmodel/status
conf=/etc/nvpmodel.conf
state=/var/lib/nvpmodel/status
name_of() { sed -n "s/^< POWER_MODEL ID=$1 NAME=\([^ ]*\) >.*/\1/p" "$conf"; }
default=$(sed -n 's/^< PM_CONFIG DEFAULT=\([0-9]*\) >.*/\1/p' "$conf")
[ -f "$state" ] || { mkdir -p /var/lib/nvpmodel; printf 'pmode:%04d\n' "$default" > "$state"; }
id=$(sed -n 's/^pmode:0*\([0-9][0-9]*\)$/\1/p' "$state"); id=${id:-0}
case "$1" in
  -q) echo "NV Power Mode: $(name_of "$id")"; echo "$id" ;;
  -p) echo "NVPM VERB: PM_CONFIG: DEFAULT=$(name_of "$default")($default)"
      sed -n 's/^< POWER_MODEL ID=\([0-9]*\) NAME=\([^ ]*\) >.*/NVPM VERB: POWER_MODEL: ID=\1 NAME=\2/p' "$conf" |
        while read -r line; do echo "$line"; echo "NVPM VERB: TPC_POWER_GATING TPC_PG_MASK 0"; done ;;
  -m) printf 'pmode:%04d\n' "$2" > "$state" ;;
esac
exit 0
"""

TEGRASTATS = """#!/bin/sh
# tegrastats stand-in (tests/rehearsal): one line a second until stopped
while :; do
  echo "RAM 1200/7620MB (lfb 10x4MB) CPU [10%@1510,8%@1510,9%@1510,7%@1510,6%@1510,5%@1510] GR3D_FREQ 0% \\
cpu@45.5C gpu@43C VDD_IN 6650mW/6650mW"
  sleep "${2:-1}"
done
"""

# pycuda as installed on a Jetson whose GPU cannot be reached: imports, cuInit fails (CUDA_ERROR_NO_DEVICE).
PYCUDA_DRIVER = '''"""pycuda stand-in (tests/rehearsal): a driver with no CUDA device."""


class Error(Exception):
    pass


class LogicError(Error):
    pass


class RuntimeError(Error):  # noqa: A001 - pycuda's own name
    pass


def init(flags=0):
    raise RuntimeError("cuInit failed: no CUDA-capable device is detected")


def get_version():
    return (12, 6, 0)


def get_driver_version():
    return 12060


class Device:
    def __init__(self, index):
        raise LogicError("cuDeviceGet failed: initialization error")

    @staticmethod
    def count():
        raise LogicError("cuDeviceGetCount failed: initialization error")
'''


# nvidia-l4t-gstreamer's elements that edge's Jetson pipelines name, as GStreamer elements written in Python (Debian's
# gstreamer1.0-python3-plugin-loader loads them): the same names and properties, software inside (jpegdec: the
# rehearsal's camera sends MJPEG; videoconvert).
GST_STAND_IN = '''"""{name} stand-in (tests/rehearsal): {inner} in place of NVIDIA's element."""
import gi

gi.require_version("Gst", "1.0")
from gi.repository import GObject, Gst  # noqa: E402

Gst.init(None)


class StandIn(Gst.Bin):
    __gstmetadata__ = ("{name} (stand-in)", "{klass}", "{inner} in place of NVIDIA's", "jetson-edge tests")
    __gsttemplates__ = (Gst.PadTemplate.new("sink", Gst.PadDirection.SINK, Gst.PadPresence.ALWAYS, Gst.Caps.new_any()),
                        Gst.PadTemplate.new("src", Gst.PadDirection.SRC, Gst.PadPresence.ALWAYS, Gst.Caps.new_any()))
    __gproperties__ = {{
        "enable-max-performance": (bool, "max performance", "ignored", False, GObject.ParamFlags.READWRITE),
        "mjpeg": (bool, "MJPEG", "ignored", False, GObject.ParamFlags.READWRITE),
    }}

    def __init__(self):
        super().__init__()
        self.values = {{}}
        inner = Gst.ElementFactory.make("{inner}")
        self.add(inner)
        for name in ("sink", "src"):
            self.add_pad(Gst.GhostPad.new_from_template(name, inner.get_static_pad(name), self.get_pad_template(name)))

    def do_get_property(self, prop):
        return self.values.get(prop.name, False)

    def do_set_property(self, prop, value):
        self.values[prop.name] = value


GObject.type_register(StandIn)
__gstelementfactory__ = ("{name}", Gst.Rank.NONE, StandIn)
'''
GST_STAND_INS = {"nvv4l2decoder": ("jpegdec", "Codec/Decoder/Video"), "nvvidconv": ("videoconvert",
                                                                                    "Filter/Converter/Video")}


def stand_in_wheel(folder: Path, name: str = "pycuda", version: str = "9999.0") -> Path:
    """A pure-Python wheel `name` (higher than any release: pip takes it over PyPI's sdist) holding the stand-in."""
    dist = "{}-{}".format(name, version)
    files = {"{}/__init__.py".format(name): "", "{}/driver.py".format(name): PYCUDA_DRIVER,
             "{}.dist-info/METADATA".format(dist): "Metadata-Version: 2.1\nName: {}\nVersion: {}\n".format(
                 name, version),
             "{}.dist-info/WHEEL".format(dist): "Wheel-Version: 1.0\nGenerator: tests/rehearsal\n"
                                                "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append("{},sha256={},{}".format(path, digest, len(text.encode())))
    record.append("{}.dist-info/RECORD,,".format(dist))
    files["{}.dist-info/RECORD".format(dist)] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "{}-py3-none-any.whl".format(dist)
    with zipfile.ZipFile(str(wheel), "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def deb(folder: Path, package: str, files: Dict[str, bytes], description: str) -> Dict[str, str]:
    """A binary package `package` (Architecture: all) holding `files` {absolute path: bytes}; its Packages entry."""
    work = folder / (package + ".build")
    for path, data in files.items():
        target = work / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o755 if path.endswith(("/nvcc",)) else 0o644)
    (work / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (work / "DEBIAN" / "control").write_text(
        "Package: {}\nVersion: 1.0-rehearsal\nArchitecture: all\nMaintainer: jetson-edge tests\n"
        "Description: {}\n".format(package, description), encoding="utf-8")
    out = folder / (package + ".deb")
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(work), str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    shutil.rmtree(str(work))
    data = out.read_bytes()
    return {"Package": package, "Version": "1.0-rehearsal", "Architecture": "all",
            "Maintainer": "jetson-edge tests", "Filename": "./" + out.name, "Size": str(len(data)),
            "SHA256": hashlib.sha256(data).hexdigest(), "Description": description}


def apt_repository(folder: Path, host_cuda: Path) -> None:
    """The packages only NVIDIA's repository has, as a local flat repository."""
    cuda = "/usr/local/cuda-" + CUDA
    tag = CUDA.replace(".", "-")
    nvcc = "#!/bin/sh\n# stand-in: this machine's nvcc, mounted at /opt/host-cuda\n" \
           "exec /opt/host-cuda/bin/nvcc \"$@\"\n"
    header = (host_cuda / "include" / "cuda.h").read_bytes()
    packages = [
        deb(folder, "python3-libnvinfer", {"/usr/share/doc/python3-libnvinfer/README": b"stand-in: no TensorRT\n"},
            "TensorRT Python bindings (stand-in: empty)"),
        deb(folder, "cuda-nvcc-" + tag, {cuda + "/bin/nvcc": nvcc.encode()}, "nvcc (stand-in: this machine's)"),
        deb(folder, "cuda-cudart-dev-" + tag, {cuda + "/include/cuda.h": header}, "CUDA headers (stand-in)"),
        deb(folder, "libcurand-dev-" + tag, {cuda + "/lib64/libcurand.so": b"", cuda + "/include/curand.h": b""},
            "cuRAND (stand-in: empty)"),
        deb(folder, "cuda-profiler-api-" + tag, {cuda + "/include/cudaProfiler.h": b"/* stand-in */\n"},
            "CUDA profiler API headers (stand-in)"),
    ]
    (folder / "Packages").write_text("\n".join("".join("{}: {}\n".format(k, v) for k, v in p.items())
                                               for p in packages), encoding="utf-8")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def shape(root: Path, host_cuda: Path) -> None:
    """Lay the Jetson's files, the stub repository and wheel, jtop's fake sysfs and drop-in into `root`."""
    _write(root / "etc/nv_tegra_release", L4T)
    hosts = root / "etc/hosts"
    known = hosts.read_text(encoding="utf-8") if hosts.is_file() else "127.0.0.1 localhost\n"
    if socket.gethostname() not in known:  # sudo resolves the machine's name
        _write(hosts, known + "127.0.1.1 {}\n".format(socket.gethostname()))
    board_conf = TESTS / "nvpmodel" / "orin_nano_8gb_super_r36.conf"
    _write(root / "etc/nvpmodel.conf", board_conf.read_text(encoding="utf-8"))
    _write(root / "usr/sbin/nvpmodel", NVPMODEL, 0o755)
    _write(root / "usr/bin/tegrastats", TEGRASTATS, 0o755)
    _write(root / "usr/bin/jetson_clocks", service_jtop.JETSON_CLOCKS.format(
        cpu=service_jtop.CPU_CUR_KHZ, gpu=service_jtop.GPU_CUR_HZ, emc=service_jtop.EMC_RATE_HZ), 0o755)
    (root / "usr/local/cuda-{}".format(CUDA)).mkdir(parents=True, exist_ok=True)
    link = root / "usr/local/cuda"
    if not link.is_symlink():
        link.symlink_to("cuda-" + CUDA)
    (root / "opt/host-cuda").mkdir(parents=True, exist_ok=True)
    apt = root / "opt/rehearsal/apt"
    apt.mkdir(parents=True, exist_ok=True)
    apt_repository(apt, host_cuda)
    _write(root / "etc/apt/sources.list.d/jetson-stubs.list", "deb [trusted=yes] file:/opt/rehearsal/apt ./\n")
    stand_in_wheel(root / "opt/rehearsal/wheels")
    # root's own pip configuration (rehearsal.sh copies this machine's /etc/pip.conf over the root's at each boot)
    _write(root / "root/.config/pip/pip.conf", "[global]\nfind-links = /opt/rehearsal/wheels\n")
    jtop = root / "opt/rehearsal/jtop"
    if not jtop.is_dir():
        service_jtop.build_tree(str(jtop))
        shutil.copytree(str(jtop / "fake_sys"), str(root / "fake_sys"), symlinks=True)
    _write(root / "etc/systemd/system/jtop.service.d/zz-rehearsal.conf",
           "# tests/rehearsal: no Jetson sysfs here; jetson-stats' testing mode reads /fake_sys\n"
           "[Service]\nEnvironment=JTOP_TESTING=true\n")
    plugins = root / "usr/lib/x86_64-linux-gnu/gstreamer-1.0/python"
    for name, (inner, klass) in GST_STAND_INS.items():
        _write(plugins / (name + ".py"), GST_STAND_IN.format(name=name, inner=inner, klass=klass))
    dt = root / "opt/rehearsal/devicetree/base"
    _write(dt / "model", MODEL + "\0")
    _write(dt / "compatible", COMPATIBLE)


def preboot(root: Path, host_cuda: Path) -> None:
    """ROOT.preboot: the mounts below, made by rehearsal.sh in the root's mount namespace before systemd starts (so
    jtop.service finds its sysfs, and the device tree is there, from the first boot on)."""
    lines = ["#!/bin/sh", "set -e"] + [" ".join(shlex.quote(a) for a in command) for command in mounts(root, host_cuda)]
    _write(root.parent / (root.name + ".preboot"), "\n".join(lines) + "\n", 0o755)


def mounts(root: Path, host_cuda: Path) -> List[List[str]]:
    """The mounts made in the root's namespace, host paths."""
    return [
        ["mount", "--bind", str(host_cuda), str(root / "opt/host-cuda")],
        ["mount", "-o", "remount,bind,ro", str(root / "opt/host-cuda")],
        ["mount", "--bind", str(root / "opt/rehearsal/jtop/virtual"), str(root / "sys/devices/virtual")],
        ["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(root / "sys/firmware")],
        ["mkdir", "-p", str(root / "sys/firmware/devicetree")],
        ["cp", "-a", str(root / "opt/rehearsal/devicetree/base"), str(root / "sys/firmware/devicetree/base")],
    ]


# A CUDA 13 nvcc from PyPI where this machine has none (the wheels the toolkit is made of; ~100 MB)
NVCC_WHEELS = ("nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-crt==13.0.88", "nvidia-nvvm==13.0.88",
               "nvidia-cuda-runtime==13.0.96", "nvidia-cuda-cccl==13.0.85")


def toolkit(cache: Path) -> Optional[Path]:
    """The CUDA toolkit whose nvcc stands in for JetPack's: this machine's, else one assembled in `cache` from
    PyPI's wheels (pip's own download); None when neither can be had."""
    found = host_cuda()
    if found is not None:
        return found
    top = cache / "nvidia" / "cu13"
    if not (top / "bin" / "nvcc").is_file():
        wheels = cache / "wheels"
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--platform", "manylinux2014_x86_64", "--dest", str(wheels)] + list(NVCC_WHEELS),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if proc.returncode != 0:
            return None
        for wheel in wheels.glob("*.whl"):
            with zipfile.ZipFile(str(wheel)) as zf:
                zf.extractall(str(cache))
        for tool in list((top / "bin").iterdir()) + list((top / "nvvm" / "bin").iterdir()):
            tool.chmod(0o755)
    return top


def host_cuda() -> Optional[Path]:
    """This machine's CUDA toolkit (nvcc, include/cuda.h), or None."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.isfile(nvcc):
        return None
    real = Path(os.path.realpath(nvcc))
    if real.parent.name == "bin" and (real.parent.parent / "include" / "cuda.h").is_file():
        return real.parent.parent
    with io.open(nvcc, "rb") as fh:  # a wrapper script (exec /usr/local/cuda-13.0/bin/nvcc "$@")
        head = fh.read(400).decode(errors="replace")
    for word in head.split():
        if word.endswith("/bin/nvcc") and os.path.isfile(word):
            top = Path(os.path.realpath(word)).parent.parent
            if (top / "include" / "cuda.h").is_file():
                return top
    return None


def source_repository(checkout: Path, target: Path) -> None:
    """The working tree as it is (tracked and untracked files git does not ignore) as a one-commit repository at
    `target`: what `git clone "$REPO"` in the docs clones."""
    listed = subprocess.run(["git", "-C", str(checkout), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], check=True, stdout=subprocess.PIPE).stdout.decode().split("\0")
    if target.exists():
        shutil.rmtree(str(target))
    target.mkdir(parents=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in filter(None, listed):
            if os.path.lexists(str(checkout / name)):
                tar.add(str(checkout / name), arcname=name, recursive=False)
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar:
        tar.extractall(str(target))
    env = dict(os.environ, GIT_AUTHOR_NAME="rehearsal", GIT_AUTHOR_EMAIL="r@localhost",
               GIT_COMMITTER_NAME="rehearsal", GIT_COMMITTER_EMAIL="r@localhost")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the working tree"]):
        subprocess.run(["git", "-C", str(target)] + args, check=True, env=env, stdout=subprocess.DEVNULL)


class HeldOpen:
    """Every open() of `path` waits until `release()`: a fanotify permission event (FAN_OPEN_PERM) answered only
    then, so the service's load of that file takes as long as the test wants, in the kernel, not in edge's code.
    `opened` is set at the first open. Needs root (CAP_SYS_ADMIN) and a kernel with fanotify permission events."""

    FAN_CLASS_CONTENT, FAN_MARK_ADD, FAN_OPEN_PERM, FAN_ALLOW, AT_FDCWD = 0x08, 0x01, 0x10000, 0x01, -100
    EVENT = struct.Struct("=IBBHQii")  # struct fanotify_event_metadata

    def __init__(self, path: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.fanotify_init(self.FAN_CLASS_CONTENT, os.O_RDONLY | getattr(os, "O_LARGEFILE", 0))
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init")
        libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        if libc.fanotify_mark(self.fd, self.FAN_MARK_ADD, self.FAN_OPEN_PERM, self.AT_FDCWD, str(path).encode()) < 0:
            os.close(self.fd)
            raise OSError(ctypes.get_errno(), "fanotify_mark {}".format(path))
        self.opened, self._released, self._closed = threading.Event(), threading.Event(), False
        self._thread = threading.Thread(target=self._answer, daemon=True)
        self._thread.start()

    def _answer(self) -> None:
        while not self._closed:
            try:
                data = os.read(self.fd, 4096)
            except OSError:
                return
            for offset in range(0, len(data), self.EVENT.size):
                event_len, _, _, _, mask, fd, _ = self.EVENT.unpack_from(data, offset)
                if fd < 0:
                    continue
                self.opened.set()
                self._released.wait()
                try:
                    if mask & self.FAN_OPEN_PERM:
                        os.write(self.fd, struct.pack("=iI", fd, self.FAN_ALLOW))
                except OSError:  # closed meanwhile: the kernel allowed it as the group went
                    pass
                os.close(fd)

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self.release()
        self._closed = True
        os.close(self.fd)  # pending permission events are allowed when the group goes

