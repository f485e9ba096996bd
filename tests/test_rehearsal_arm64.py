"""The Jetson's own CPU, rehearsed (issue 42): the day-one CPU path on aarch64, on this x86 machine through
qemu-user. The rehearsal's slow variant (`-m slow`, off the default run): emulation makes it about ten times slower.

An arm64 Debian root (tests/rehearsal/rehearsal.sh with EDGE_REHEARSAL_ARCH=arm64) boots with systemd 252 as PID 1
under qemu-user, and the commands run inside it: JetPack's packages as the install recipe takes them (apt's
python3-opencv, a venv that sees it, pip under constraints/jetpack6.txt resolving aarch64 wheels), the docs' model
and CPU blocks (the PC's export is the suite's tiny classifier, made by the real `edge export` code on this
machine, as the docs export on a PC), `edge build` making and gating the INT8 Q/DQ ONNX on ARM's ONNX Runtime, and
`edge run --frames 60` serving it, then jetson-edge.service itself started by the root's systemd until its STATUS
reports fps. Not the installer (its JetPack stand-ins, tests/rehearsal/jetson.py, run this machine's x86 nvcc): the
service user, its folders and groups and the unit are laid by hand as the installer would.

Skipped, with the reason, without root, qemu-user-static's aarch64 interpreter, debootstrap, the Debian mirror or
the Python package index. EDGE_REHEARSAL_ARM64_ROOT=.../root runs on a root kept from an earlier run (installed,
not powered off); EDGE_REHEARSAL_KEEP=1 keeps the root. The measured times and figures print with `-s`.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import service_helpers as sh
from test_rehearsal import REHEARSAL, day_one

from conftest import REPO

pytestmark = pytest.mark.slow

BINFMT = Path("/proc/sys/fs/binfmt_misc")
QEMU_ENTRY = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")  # qemu-user-static's
ENGINES = "/var/lib/jetson-edge/engines"
CONFIG = "/etc/jetson-edge/config.yaml"
TIMES: Dict[str, float] = {}


def binfmt() -> Optional[str]:
    """qemu-user's aarch64 entry registered (binfmt_misc mounted first); None when it is, else why not."""
    if not QEMU_ENTRY.is_file():
        return "no {} (apt-get install qemu-user-static)".format(QEMU_ENTRY)
    if not (BINFMT / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True)
    if not (BINFMT / "qemu-aarch64").exists():
        try:
            (BINFMT / "register").write_text(QEMU_ENTRY.read_text(encoding="utf-8").strip(), encoding="utf-8")
        except OSError as exc:
            return "cannot register qemu-aarch64 with binfmt_misc ({})".format(exc)
    return None


def unavailable() -> Optional[str]:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (it boots an arm64 root with systemd in its own namespaces)"
    for tool in ("unshare", "nsenter", "git"):
        if shutil.which(tool) is None:
            return "{} not installed".format(tool)
    if shutil.which("debootstrap") is None:
        return "no debootstrap (apt-get install debootstrap)"
    for url, what in (("http://deb.debian.org/debian/dists/bookworm/Release", "the Debian mirror"),
                      (os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/") + "/onnxruntime/",
                       "the Python package index")):
        try:
            urllib.request.urlopen(url, timeout=15).close()
        except OSError as exc:
            return "{} is not reachable ({})".format(what, exc)
    return binfmt()


def orin_cpuinfo(cores: int) -> str:
    """/proc/cpuinfo of an Orin (Cortex-A78AE cores), with this machine's number of processors."""
    return "".join("processor\t: {}\nBogoMIPS\t: 62.50\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 "
                   "atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp uscat ilrcpc flagm paca pacg\n"
                   "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd42\n"
                   "CPU revision\t: 1\n\n".format(i) for i in range(cores))


class Arm64:
    """The booted arm64 root: `run` a bash script inside."""

    def __init__(self, root: Path):
        self.root = root
        self.pid = ""

    def up(self) -> float:
        started = time.monotonic()
        proc = subprocess.run([str(REHEARSAL), "up", str(self.root)], capture_output=True, encoding="utf-8",
                              errors="replace", timeout=1800, env=dict(os.environ, EDGE_REHEARSAL_ARCH="arm64"))
        assert proc.returncode == 0, "rehearsal.sh up failed: {}".format(proc.stderr)
        # The root's /proc is this machine's, whose x86 /proc/cpuinfo crashes ONNX Runtime's cpuinfo on import
        # under qemu-user (SIGSEGV): an Orin's is mounted over it, as a Jetson has it.
        cpuinfo = self.root.parent / (self.root.name + ".cpuinfo")
        cpuinfo.write_text(orin_cpuinfo(os.cpu_count() or 1), encoding="utf-8")
        self.pid = proc.stdout.split()[-1]
        subprocess.run(["nsenter", "-t", self.pid, "-m", "mount", "--bind", str(cpuinfo),
                        str(self.root / "proc/cpuinfo")], check=True)
        return time.monotonic() - started

    def copy_in(self, source: str, target: str) -> None:
        """A file of this machine to `target` in the root, through its mount namespace (its /tmp is a tmpfs there)."""
        subprocess.run(["nsenter", "-t", self.pid, "-m", "cp", source, str(self.root) + target], check=True)

    def down(self) -> None:
        subprocess.run([str(REHEARSAL), "down", str(self.root)], timeout=300)

    def run(self, script: str, timeout: float = 3600) -> str:
        proc = subprocess.run([str(REHEARSAL), "run", str(self.root), "bash", "-ec", script], capture_output=True,
                              encoding="utf-8", errors="replace", timeout=timeout)
        assert proc.returncode == 0, "inside the arm64 root, exit {}:\n{}\n--- stdout\n{}\n--- stderr\n{}".format(
            proc.returncode, script, proc.stdout[-4000:], proc.stderr[-4000:])
        return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def arm64():
    reason = unavailable()
    if reason:
        pytest.skip("arm64 rehearsal: " + reason)
    reuse = os.environ.get("EDGE_REHEARSAL_ARM64_ROOT")
    base = Path(reuse).parent if reuse else Path(tempfile.mkdtemp(prefix="edge-rehearsal-arm64-", dir="/var/tmp"))
    m = Arm64(Path(reuse) if reuse else base / "root")
    TIMES["debootstrap (arm64) and boot"] = m.up()
    yield m
    if not reuse:
        m.down()
        if not os.environ.get("EDGE_REHEARSAL_KEEP"):
            shutil.rmtree(str(base), ignore_errors=True)
    print("\narm64 rehearsal times (s): " + ", ".join("{} {:.0f}".format(k, v) for k, v in TIMES.items()))


def checkout(target: Path) -> None:
    """This checkout's files (tracked and untracked, not ignored) at `target`, as a clone would leave them."""
    files = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if os.path.isfile(os.path.join(REPO, name)):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), str(target / name))


@pytest.fixture(scope="module")
def installed(arm64: Arm64) -> Arm64:
    """JetPack 6's recipe, as far as it goes off a Jetson (scripts/install_service.sh's install_recipe): apt's
    OpenCV, a venv that sees it, pip under constraints/jetpack6.txt."""
    if (arm64.root / "opt/jetson-edge/.venv/bin/edge").exists():
        return arm64
    checkout(arm64.root / "opt/jetson-edge")
    started = time.monotonic()
    arm64.run("DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null\n"
              "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-opencv >/dev/null")
    TIMES["apt python3-opencv"] = time.monotonic() - started
    started = time.monotonic()
    arm64.run("cd /opt/jetson-edge && python3 -m venv --system-site-packages .venv\n"
              "export PIP_CONSTRAINT=constraints/jetpack6.txt\n"
              ".venv/bin/python -m pip install -q --upgrade 'pip>=23.1'\n"
              ".venv/bin/pip install -q -e '.[jetson,service,check]'")
    TIMES["pip install (jetpack6 constraints)"] = time.monotonic() - started
    return arm64


def test_pip_resolves_the_project_for_aarch64_under_jetpack6_constraints(installed: Arm64) -> None:
    out = installed.run("cd /opt/jetson-edge && .venv/bin/python -c 'import platform, numpy, cv2, onnxruntime, onnx; "
                        "print(platform.machine(), numpy.__version__, cv2.__file__, onnxruntime.__version__, "
                        "onnx.__version__)'").split()
    machine, numpy, cv2, ort = out[-5:-1]
    assert machine == "aarch64"
    assert numpy.startswith("1.") and cv2.startswith("/usr/lib/python3/dist-packages/cv2")  # NumPy 1.x, apt's OpenCV
    print("\narm64: numpy {} onnxruntime {} onnx {} ({})".format(numpy, ort, out[-1], cv2))


@pytest.fixture(scope="module")
def built(installed: Arm64, tiny_classifiers: List[str]) -> Dict[str, Any]:
    """The docs' model and CPU blocks, their build on ARM's ONNX Runtime: the service's folders as the installer
    lays them (config, shipped calibration and regression sets, the service user), then the blocks as written
    but for `systemctl start` (no unit here: `edge run` serves below)."""
    m = installed
    model = tiny_classifiers[0][:-len(".onnx")]
    for ext in (".onnx", ".labels.txt", ".json"):  # what the PC's export and scp leave in /tmp
        m.copy_in(model + ext, "/tmp/mobilenet_v3_large" + ext)
    blocks = "\n".join(line for line in (day_one("model") + day_one("cpu")).splitlines()
                       if not line.startswith("sudo systemctl start"))
    started = time.monotonic()
    out = m.run("id jetson-edge >/dev/null 2>&1 || useradd --system --home-dir /var/lib/jetson-edge jetson-edge\n"
                "install -d -o jetson-edge -g jetson-edge {engines} /var/lib/jetson-edge/calibration\n"
                "install -d /etc/jetson-edge && cp /opt/jetson-edge/systemd/config.yaml {config}\n"
                "cp -R /opt/jetson-edge/calibration/default /opt/jetson-edge/calibration/regression "
                "/var/lib/jetson-edge/calibration/ && chown -R jetson-edge: /var/lib/jetson-edge\n".format(
                    engines=ENGINES, config=CONFIG) + blocks)
    TIMES["model + cpu blocks (edge build)"] = time.monotonic() - started
    gate = re.search(r"gate: (\w+) - (.*) \(report (\S+)\)", out)
    assert gate is not None, out[-3000:]
    report = json.loads((m.root / gate.group(3).lstrip("/")).read_text(encoding="utf-8"))
    return {"out": out, "verdict": gate.group(1), "summary": gate.group(2), "report": report}


def test_edge_build_makes_and_gates_the_qdq_onnx_on_arms_onnx_runtime(built: Dict[str, Any]) -> None:
    kernels = built["report"]["this_cpu_int8_kernels"]
    assert built["verdict"] in ("passed", "FAILED", "inconclusive"), built["summary"]
    assert "install: {}/mobilenet_v3_large.int8.onnx".format(ENGINES) in built["out"], built["out"][-3000:]
    # served = judged: the service serves the emulated Q/DQ graph the gate judged; ARM's fused int8 kernels do not
    # saturate (unlike x86's AVX2 u8s8 path), so there the two agree as well
    assert kernels["served"] == "emulated" and kernels["saturate"] is False, kernels
    print("\narm64 gate: {} - {}; this CPU's int8 kernels: {}".format(built["verdict"], built["summary"],
                                                                      json.dumps(kernels)))


def test_edge_run_serves_frames_on_arm(built: Dict[str, Any], installed: Arm64) -> None:
    started = time.monotonic()
    # the camera: the synthetic source at 320x240, given 2 minutes for its first frame (emulated, on a loaded
    # machine, the first 720p frame took longer than the default 10 s); the metrics on a free port (the root
    # shares this machine's network)
    edit = ("import sys, yaml; p = sys.argv[1]; d = yaml.safe_load(open(p))\n"
            "d['source'].update(uri='synthetic', width=320, height=240, start_timeout_s=120)\n"
            "d['service']['metrics']['port'] = int(sys.argv[2]); yaml.safe_dump(d, open(p, 'w'), sort_keys=False)\n")
    out = installed.run("/opt/jetson-edge/.venv/bin/python -c \"{}\" {} {}\n".format(edit, CONFIG, sh.free_port()) +
                        "cd /var/lib/jetson-edge && sudo -u jetson-edge /opt/jetson-edge/.venv/bin/edge run --config "
                        "{} --frames 60 --budget-ms 1000".format(CONFIG))
    TIMES["edge run --frames 60"] = time.monotonic() - started
    lines = sh.json_lines(out)
    start = next(r for r in lines if r.get("event") == "start")
    report = next(r for r in lines if r.get("event") == "report")
    assert start["backend"] == "onnxruntime" and start["model"] == ENGINES + "/mobilenet_v3_large.int8.onnx"
    assert report["frames"] == 60 and report["errors"] == 0, report
    print("\narm64 edge run: " + json.dumps({k: report[k] for k in report if k != "event"}))


def test_the_unit_serves_under_systemd_on_arm(built: Dict[str, Any], installed: Arm64) -> None:
    """jetson-edge.service itself (Type=notify, WatchdogSec, the whole sandbox) started by the root's systemd on the
    CPU block's model. Its own /proc (ProtectProc=) is this machine's again: a drop-in binds the Orin's cpuinfo."""
    m = installed
    m.copy_in(str(m.root.parent / (m.root.name + ".cpuinfo")), "/etc/orin-cpuinfo")
    started = time.monotonic()
    m.run("for g in video render jtop; do getent group $g >/dev/null || groupadd --system $g; done\n"
          "cp /opt/jetson-edge/systemd/jetson-edge.service /etc/systemd/system/\n"
          "mkdir -p /etc/systemd/system/jetson-edge.service.d\n"
          "printf '[Service]\\nBindReadOnlyPaths=/etc/orin-cpuinfo:/proc/cpuinfo\\n' "
          ">/etc/systemd/system/jetson-edge.service.d/rehearsal-cpuinfo.conf\n"
          "systemctl daemon-reload && systemctl reset-failed jetson-edge 2>/dev/null || true\n"
          "systemctl restart jetson-edge")

    def show() -> Dict[str, str]:
        out = m.run("systemctl show jetson-edge -p ActiveState -p StatusText -p NRestarts")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    try:
        assert sh.wait_until(lambda: "fps" in show().get("StatusText", ""), 300, 2), show()
        TIMES["unit: start to STATUS fps"] = time.monotonic() - started
        state = show()
        assert state["ActiveState"] == "active" and state["NRestarts"] == "0", state
        print("\narm64 unit: " + state["StatusText"])
    finally:
        m.run("systemctl stop jetson-edge")
