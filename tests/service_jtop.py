"""Run jetson-stats' real jtop service off-Jetson, in its testing mode, for tests/test_telemetry.py.

`JTOP_TESTING=true` makes the service read a fake sysfs at the hard-coded /fake_sys; the rest it still reads
from the real system (dmi, thermal zones under /sys/devices/virtual, `nvpmodel` on PATH, the exact path
/usr/bin/jetson_clocks, its config under sys.base_prefix/local/jtop). So the service runs in a private mount
namespace (`unshare -m --propagation private`) where:
  /fake_sys               <- bind mount of a temporary tree (CPU, GPU devfreq, EMC, INA3221 power rails)
  /sys/devices/virtual    <- bind mount of a temporary tree (dmi/id, thermal_zone0..1)
  sys.base_prefix         <- overlay with a tmpfs upper layer (jtop writes its config.json there)
  /usr/bin                <- overlay adding fake `nvpmodel` and `jetson_clocks` scripts
The host sees none of it; on the host only the empty mount point /fake_sys (removed afterwards), the socket
/run/jtop.sock (removed by the service on SIGTERM, by us if not) and, if it did not exist, the `jtop` group
(deleted afterwards) appear. Needs root, unshare, overlayfs and a jtop `jtop` console script.
"""

import grp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SOCKET = "/run/jtop.sock"
FAKE_SYS = "/fake_sys"
READY = "jtop.service - service ready"  # the service's log line once its control loop runs

# What the fake board reports, and what a reader should therefore see.
CPU_CUR_KHZ = 1200000
GPU_CUR_HZ = 612000000
GPU_LOAD_PERMILLE = 420
EMC_RATE_HZ = 2133000000
THERMAL = {"cpu-thermal": 45500, "gpu-thermal": 43000}  # millidegrees; jtop names them cpu and gpu
RAILS = {"VDD_IN": (5000, 1330), "VDD_CPU_GPU_CV": (5000, 600)}  # mV, mA; VDD_IN becomes the total
NVP_MODES = ("MAXN", "MODE_15W")
NVP_CURRENT = 1

NVPMODEL = """#!/bin/sh
# fake nvpmodel for the jtop service in testing mode
state="{state}"
[ -f "$state" ] || echo {current} > "$state"
case "$1" in
  -p)
    echo "NVPM VERB: PM_CONFIG: DEFAULT={default}({current})"
{modes}    ;;
  -q)
    id=$(cat "$state")
{names}    echo "NV Power Mode: $name"
    echo "$id"
    ;;
  -m) echo "$2" > "$state" ;;
esac
exit 0
"""

JETSON_CLOCKS = """#!/bin/sh
# fake jetson_clocks for the jtop service in testing mode: clocks not pinned (min != max)
case "$1" in
  --show)
    echo "SOC family:fake  Machine:fake"
    echo "cpu0: Online=1 Governor=schedutil MinFreq=0 MaxFreq=2035200 CurrentFreq={cpu}"
    echo "cpu1: Online=1 Governor=schedutil MinFreq=0 MaxFreq=2035200 CurrentFreq={cpu}"
    echo "GPU MinFreq=0 MaxFreq=921600000 CurrentFreq={gpu}"
    echo "EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq={emc} FreqOverride=0"
    ;;
  --store) touch "$2" ;;
esac
exit 0
"""

LAUNCHER = """set -e
mount --bind "$T/fake_sys" /fake_sys
mount --bind "$T/virtual" /sys/devices/virtual
mount -t tmpfs tmpfs "$T/rw"
mkdir -p "$T/rw/up" "$T/rw/work" "$T/rw/binup" "$T/rw/binwork"
mount -t overlay overlay -o "lowerdir=$BASE,upperdir=$T/rw/up,workdir=$T/rw/work" "$BASE"
mount -t overlay overlay -o "lowerdir=$T/bin:/usr/bin" /usr/bin
exec env JTOP_SERVICE=True JTOP_TESTING=true "$JTOP" --force
"""


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(str(text))


def build_tree(root):
    """The fake sysfs, dmi/thermal tree and scripts under `root`."""
    fs = os.path.join(root, "fake_sys")
    stat = "cpu  2000 0 1000 90000 0 0 0 0 0 0\n"
    for n in range(2):
        cpu = os.path.join(fs, "devices/system/cpu/cpu{}".format(n))
        for name, value in (("scaling_governor", "schedutil"), ("scaling_min_freq", 0),
                            ("scaling_max_freq", 2035200), ("scaling_cur_freq", CPU_CUR_KHZ),
                            ("cpuinfo_min_freq", 0), ("cpuinfo_max_freq", 2035200),
                            ("cpuinfo_cur_freq", CPU_CUR_KHZ)):
            _write(os.path.join(cpu, "cpufreq", name), value)
        stat += "cpu{} 1000 0 500 45000 0 0 0 0 0 0\n".format(n)
    _write(os.path.join(fs, "stat"), stat + "intr 0\nctxt 0\nbtime 0\nprocesses 1\nprocs_running 1\n")
    gpu = os.path.join(fs, "devices/platform/17000000.gpu/devfreq/17000000.gpu")
    for name, value in (("cur_freq", GPU_CUR_HZ), ("max_freq", 921600000), ("min_freq", 0),
                        ("governor", "nvhost_podgov")):
        _write(os.path.join(gpu, name), value)
    _write(os.path.join(gpu, "device/of_node/name"), "gpu")
    for name, value in (("railgate_enable", 0), ("tpc_pg_mask", 0), ("enable_3d_scaling", 1),
                        ("load", GPU_LOAD_PERMILLE)):
        _write(os.path.join(gpu, "device", name), value)
    os.makedirs(os.path.join(fs, "class/devfreq"))
    os.symlink(os.path.join(FAKE_SYS, "devices/platform/17000000.gpu/devfreq/17000000.gpu"),
               os.path.join(fs, "class/devfreq/17000000.gpu"))
    emc = os.path.join(fs, "kernel/debug/bpmp/debug/clk/emc")
    for name, value in (("rate", EMC_RATE_HZ), ("max_rate", 3199000000), ("min_rate", 204000000),
                        ("mrq_rate_locked", 3199000000)):
        _write(os.path.join(emc, name), value)
    _write(os.path.join(fs, "kernel/actmon_avg_activity/mc_all"), 0)
    ina = os.path.join(fs, "bus/i2c/devices/1-0040")
    _write(os.path.join(ina, "name"), "ina3221")
    for k, (label, (mv, ma)) in enumerate(RAILS.items(), start=1):
        hw = os.path.join(ina, "hwmon/hwmon3")
        _write(os.path.join(hw, "in{}_label".format(k)), label)
        _write(os.path.join(hw, "in{}_input".format(k)), mv)
        _write(os.path.join(hw, "curr{}_input".format(k)), ma)
        _write(os.path.join(hw, "curr{}_max".format(k)), 10000)
        _write(os.path.join(hw, "curr{}_crit".format(k)), 12000)
    virtual = os.path.join(root, "virtual")
    for name, value in (("board_vendor", "jetson-edge tests"), ("product_name", "fake jetson"),
                        ("bios_version", "0")):
        _write(os.path.join(virtual, "dmi/id", name), value)
    for n, (zone, milli) in enumerate(THERMAL.items()):
        _write(os.path.join(virtual, "thermal/thermal_zone{}/type".format(n)), zone)
        _write(os.path.join(virtual, "thermal/thermal_zone{}/temp".format(n)), milli)
    bin_dir = os.path.join(root, "bin")
    modes = "".join('    echo "NVPM VERB: POWER_MODEL: ID={} NAME={}"\n    echo "NVPM VERB: TPC_POWER_GATING '
                    'TPC_PG_MASK 0"\n'.format(i, m) for i, m in enumerate(NVP_MODES))
    names = "".join('    [ "$id" = "{}" ] && name={}\n'.format(i, m) for i, m in enumerate(NVP_MODES))
    _write(os.path.join(bin_dir, "nvpmodel"), NVPMODEL.format(
        state=os.path.join(root, "nvpmodel.state"), current=NVP_CURRENT, default=NVP_MODES[NVP_CURRENT],
        modes=modes, names=names))
    _write(os.path.join(bin_dir, "jetson_clocks"), JETSON_CLOCKS.format(cpu=CPU_CUR_KHZ, gpu=GPU_CUR_HZ,
                                                                        emc=EMC_RATE_HZ))
    for script in ("nvpmodel", "jetson_clocks"):
        os.chmod(os.path.join(bin_dir, script), 0o755)
    os.makedirs(os.path.join(root, "rw"))
    _write(os.path.join(root, "launcher.sh"), LAUNCHER)


def unavailable():
    """Why the real service cannot run here, or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (mount namespace, the jtop group, /run/jtop.sock)"
    if os.path.exists(SOCKET):
        return "{} already exists (a real jtop service?); not touching it".format(SOCKET)
    if os.path.exists(FAKE_SYS) and os.listdir(FAKE_SYS):
        return "{} exists and is not empty; not touching it".format(FAKE_SYS)
    if shutil.which("unshare") is None:
        return "unshare (util-linux) not installed"
    if not os.path.exists(os.path.join(os.path.dirname(sys.executable), "jtop")):
        return "jetson-stats (the jtop console script) not installed in this environment"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /mnt"], capture_output=True, encoding="utf-8", errors="replace")
    if probe.returncode != 0:
        return "cannot create a mount namespace here: " + probe.stderr.strip()
    return None


class JtopService:
    """The real jtop service in testing mode; start() waits for its socket, stop() by PID and cleans up."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="edge-jtop-")
        self.proc = None
        self.made_group = False
        self.made_fake_sys = False
        self.log_path = os.path.join(self.root, "service.log")

    def setup(self):
        build_tree(self.root)
        try:
            grp.getgrnam("jtop")
        except KeyError:
            subprocess.run(["groupadd", "--system", "jtop"], check=True)
            self.made_group = True
        if not os.path.isdir(FAKE_SYS):
            os.mkdir(FAKE_SYS)
            self.made_fake_sys = True

    def start(self, timeout=30.0):
        """Start the service and wait for it to say it serves: its control loop reads the queue from its
        `service ready` line on (the socket exists earlier, while the service still initialises its board)."""
        ready = self.log().count(READY)
        env = dict(os.environ, T=self.root, BASE=sys.base_prefix,
                   JTOP=os.path.join(os.path.dirname(sys.executable), "jtop"))
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "bash",
                                      os.path.join(self.root, "launcher.sh")], env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.log().count(READY) > ready and os.path.exists(SOCKET):
                return
            time.sleep(0.05)
        raise RuntimeError("jtop service did not start: " + self.log()[-3000:])

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace", encoding="utf-8") as fh:
                return fh.read()
        except OSError:
            return ""

    def stop(self):
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the manager and server processes it forked
        except (ProcessLookupError, PermissionError):
            pass
        if os.path.exists(SOCKET):
            os.remove(SOCKET)

    def cleanup(self):
        self.stop()
        if self.made_fake_sys:
            try:
                os.rmdir(FAKE_SYS)
            except OSError:
                pass
        if self.made_group:
            subprocess.run(["groupdel", "jtop"], check=False)
        shutil.rmtree(self.root, ignore_errors=True)
