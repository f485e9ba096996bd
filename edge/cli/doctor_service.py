"""`edge doctor --as-service`: the same checks, run as the installed service runs: a transient unit
(`systemd-run --pipe --wait`) with the unit's user, groups and sandbox settings, so the kernel folder, /dev/nv*, the
jtop socket and the Argus socket are checked for the service's account. The transient unit leaves the running
service's folders alone, and takes only the settings this systemd knows (JetPack 5's 245 refuses ProtectProc=).
"""

import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence

from edge.errors import EdgeError

UNIT = "/etc/systemd/system/jetson-edge.service"
# [Service] settings of the unit that are not about the sandbox: not given to `systemd-run` by --as-service.
_NOT_SANDBOX = ("Type", "NotifyAccess", "WatchdogSec", "TimeoutStartSec", "TimeoutStopSec", "Restart", "RestartSec",
                "RestartPreventExitStatus", "ExecStart", "ExecStartPre", "ExecReload", "KillSignal")


# Settings newer than some JetPack's systemd (JetPack 5: 245): left out where systemd-run would refuse them.
_SINCE = {"ProtectProc": 247, "ProcSubset": 247}
# The transient unit's own runtime directory: sharing the service's would remove /run/jetson-edge under the running
# service when the check ends (RuntimeDirectory= is removed at stop).
_OWN_RUNTIME = ("RuntimeDirectory=jetson-edge", "TMPDIR=/run/jetson-edge")


def systemd_version() -> int:
    """246 from `systemctl --version` ('systemd 246 (246.9)'); 0 when it says nothing usable."""
    try:
        out = subprocess.run(["systemctl", "--version"], capture_output=True,
                             encoding="utf-8", errors="replace", timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    words = out.split()
    return int(words[1]) if len(words) > 1 and words[0] == "systemd" and words[1].isdigit() else 0


def sandbox_properties(unit: str = UNIT, version: Optional[int] = None) -> List[str]:
    """The installed unit's [Service] user, groups and sandbox as `systemd-run --property=` arguments, for this
    systemd `version`, with a runtime directory of its own."""
    version = systemd_version() if version is None else version
    try:
        with open(unit, "r", encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise EdgeError("--as-service reads the installed unit {}: {} (sudo scripts/install_service.sh)".format(
            unit, exc.strerror)) from None
    props, section = [], ""
    for line in (raw.strip() for raw in text.splitlines()):
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
            key = line.split("=", 1)[0].strip()
            if key not in _NOT_SANDBOX and version >= _SINCE.get(key, 0):
                for shared in _OWN_RUNTIME:
                    line = line.replace(shared, shared.replace("jetson-edge", "jetson-edge-doctor"))
                props.append("--property=" + line)
    return props


def run_as_service(argv: Sequence[str]) -> int:
    """`edge doctor` again, as a transient unit with the service's user, groups and sandbox (systemd-run)."""
    systemd_run = shutil.which("systemd-run")
    if systemd_run is None or not os.path.isdir("/run/systemd/system"):
        raise EdgeError("--as-service needs a running systemd (systemd-run): run it on the device, as root")
    command = [systemd_run, "--pipe", "--wait", "--quiet", "--collect"] + sandbox_properties() + \
        [sys.executable, "-m", "edge", "doctor"] + [a for a in argv if a != "--as-service"]
    return subprocess.run(command).returncode
