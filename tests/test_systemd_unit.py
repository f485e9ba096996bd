"""systemd/: the unit passes systemd-analyze verify, the default config is valid, the installer is idempotent."""

import hashlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from edge.config import load_config

from conftest import REPO

UNIT = os.path.join(REPO, "systemd", "jetson-edge.service")
CONFIG = os.path.join(REPO, "systemd", "config.yaml")
INSTALL = os.path.join(REPO, "scripts", "install_service.sh")


def unit_settings(path=UNIT):
    """[(section, key, value)] in file order (unit files repeat keys, so not a configparser)."""
    out, section = [], None
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            key, _, value = line.partition("=")
            out.append((section, key.strip(), value.strip()))
    return out


def get(key, section="Service"):
    values = [v for s, k, v in unit_settings() if s == section and k == key]
    assert values, "{} missing from [{}]".format(key, section)
    return values[-1] if len(values) == 1 else values


ENGINE_UNIT = os.path.join(REPO, "systemd", "jetson-edge-engine.service")


@pytest.mark.parametrize("unit", [UNIT, ENGINE_UNIT], ids=["service", "engine"])
def test_unit_passes_systemd_analyze_verify(tmp_path, unit):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd; scripts/bootstrap.sh --dev as root)")
    edge_bin = os.path.join(os.path.dirname(sys.executable), "edge")
    assert os.access(edge_bin, os.X_OK), "the edge console script is not installed in this venv"
    text = open(unit,
                encoding="utf-8").read().replace("/opt/jetson-edge/.venv/bin/edge", edge_bin)  # verify checks it exists
    copy = tmp_path / os.path.basename(unit)
    copy.write_text(text, encoding="utf-8")
    proc = subprocess.run([analyze, "verify", str(copy)], capture_output=True,
                          encoding="utf-8", errors="replace", cwd=str(tmp_path))
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if "jetson-edge" in line]
    assert proc.returncode == 0 and ours == [], proc.stdout + proc.stderr  # verify also *warns* with rc 0
    # and it does check: a unit whose binary is missing fails
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / os.path.basename(unit)).write_text(open(unit, encoding="utf-8").read(), encoding="utf-8")
    bad = subprocess.run([analyze, "verify", str(tmp_path / "bad" / os.path.basename(unit))], capture_output=True,
                         encoding="utf-8", errors="replace")
    assert bad.returncode != 0 and "/opt/jetson-edge/.venv/bin/edge" in bad.stdout + bad.stderr


def test_unit_is_a_hardened_notify_service_that_keeps_devices_visible():
    assert get("Type") == "notify" and get("NotifyAccess") == "main"
    assert get("Restart") == "on-failure" and get("RestartSec") and get("WatchdogSec") == "10s"
    assert get("RestartPreventExitStatus") == "2"  # a config error or a missing model: stop at once
    # never gives up for good (issue 42 item 8): no start limit, exit 2 alone stops it
    assert get("StartLimitIntervalSec", "Unit") == "0" and "StartLimitBurst" not in {k for _, k, _ in unit_settings()}
    assert get("LimitCORE") == "0"  # no core dump of a watchdog SIGABRT on the SD card
    assert get("User") == "jetson-edge"
    assert set(get("SupplementaryGroups").split()) == {"video", "render", "jtop"}
    assert get("NoNewPrivileges") == "yes" and get("ProtectSystem") == "strict" and get("ProtectHome") == "yes"
    assert "jetson-edge" in get("StateDirectory").split() and get("ConfigurationDirectory") == "jetson-edge"
    keys = {k for _, k, _ in unit_settings()}
    assert "PrivateDevices" not in keys, "PrivateDevices hides /dev/video* and /dev/nvhost-*"
    assert "MemoryDenyWriteExecute" not in keys
    text = open(UNIT, encoding="utf-8").read()
    assert "PrivateDevices" in text and "/dev/nvhost" in text  # the reason is written down
    assert {"jtop.service", "nvargus-daemon.service"} <= set(get("After", "Unit").split())
    # no boot waits for the network (issue 42 item 9): a network source is retried; the drop-in is documented
    assert "network-online.target" not in get("After", "Unit") + get("Wants", "Unit")
    assert get("Environment") == ["PYTHONUNBUFFERED=1", "TMPDIR=/run/jetson-edge"]
    assert get("RuntimeDirectory") == "jetson-edge"  # TMPDIR: the host's /tmp is read-only (ProtectSystem=strict)
    assert get("ExecStart") == "/opt/jetson-edge/.venv/bin/edge run --config /etc/jetson-edge/config.yaml"
    assert get("ExecReload") == "/bin/kill -HUP $MAINPID"
    # power mode and clocks are set outside the unit (issue 42 item 5): no `nvpmodel -m 0` (not the max everywhere)
    assert "nvpmodel -m" not in text and "ExecStartPre" not in keys
    assert get("WantedBy", "Install") == "multi-user.target"


def test_default_device_config_is_valid_and_local_only():
    cfg = load_config(CONFIG)
    assert cfg.source.uri in ("csi://0", "/dev/video0")
    assert cfg.service.metrics.enabled and cfg.service.metrics.host == "127.0.0.1"
    assert cfg.service.telemetry.enabled
    assert cfg.model.path.startswith("/var/lib/jetson-edge/engines/")
    assert cfg.runtime.budget_ms == 30


def run_install(*args, destdir, script=INSTALL):
    env = dict(os.environ, DESTDIR=str(destdir))
    return subprocess.run(["bash", script] + list(args), capture_output=True,
                          encoding="utf-8", errors="replace", env=env, timeout=60)


def tree(root):
    """{relative path: sha256} of every file under root."""
    out = {}
    for dirpath, _, files in os.walk(str(root)):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, str(root))] = hashlib.sha256(fh.read()).hexdigest()
    return out


def test_installer_stages_files_and_is_idempotent(tmp_path):
    dest = tmp_path / "root"
    first = run_install("--prefix", "/srv/edge", destdir=dest)
    assert first.returncode == 0, first.stderr
    unit = (dest / "etc/systemd/system/jetson-edge.service").read_text(encoding="utf-8")
    assert "ExecStart=/srv/edge/.venv/bin/edge run --config /etc/jetson-edge/config.yaml" in unit
    assert "/opt/jetson-edge" not in unit
    assert (dest / "etc/jetson-edge/config.yaml").read_text(encoding="utf-8") == open(CONFIG, encoding="utf-8").read()
    assert (dest / "var/lib/jetson-edge/engines").is_dir()
    for name in ("default", "regression"):  # where the config's build section points
        shipped = os.path.join(REPO, "calibration", name)
        staged = dest / "var/lib/jetson-edge/calibration" / name
        assert sorted(os.listdir(str(staged))) == sorted(os.listdir(shipped))
    assert load_config(CONFIG).build.calibration_dir == "/var/lib/jetson-edge/calibration/default"
    before = tree(dest)
    second = run_install("--prefix", "/srv/edge", destdir=dest)
    assert second.returncode == 0 and tree(dest) == before
    assert "unchanged" in second.stdout and "installing" not in second.stdout


def test_installer_keeps_a_calibration_set_that_is_there(tmp_path):
    dest = tmp_path / "root"
    own = dest / "var/lib/jetson-edge/calibration/default"
    own.mkdir(parents=True)
    (own / "mine.jpg").write_bytes(b"my own set")
    proc = run_install(destdir=dest)
    assert proc.returncode == 0 and "calibration set {} exists: kept".format(
        "/var/lib/jetson-edge/calibration/default") in proc.stdout.replace(str(dest), "")
    assert os.listdir(str(own)) == ["mine.jpg"]
    assert (dest / "var/lib/jetson-edge/calibration/regression").is_dir()


def test_installer_never_overwrites_an_edited_config(tmp_path):
    dest = tmp_path / "root"
    assert run_install(destdir=dest).returncode == 0
    config = dest / "etc/jetson-edge/config.yaml"
    edited = config.read_text(encoding="utf-8").replace("uri: csi://0", "uri: /dev/video1")
    config.write_text(edited, encoding="utf-8")
    proc = run_install(destdir=dest)
    assert proc.returncode == 0 and "keeping" in proc.stdout
    assert config.read_text(encoding="utf-8") == edited
    assert (dest / "etc/jetson-edge/config.yaml.dist").read_text(encoding="utf-8") == open(CONFIG,
                                                                                           encoding="utf-8").read()


def test_installer_updates_an_untouched_config_when_the_shipped_one_changes(tmp_path):
    # a copy of the repo's installer and systemd/ whose shipped config then changes (a new release)
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(INSTALL, str(repo / "scripts"))
    shutil.copytree(os.path.join(REPO, "systemd"), str(repo / "systemd"))
    shutil.copytree(os.path.join(REPO, "calibration"), str(repo / "calibration"))
    script = str(repo / "scripts" / "install_service.sh")
    dest = tmp_path / "root"
    assert run_install(destdir=dest, script=script).returncode == 0
    new = open(CONFIG, encoding="utf-8").read().replace("report_every: 300", "report_every: 600")
    (repo / "systemd" / "config.yaml").write_text(new, encoding="utf-8")
    proc = run_install(destdir=dest, script=script)
    assert proc.returncode == 0 and "updating" in proc.stdout
    assert (dest / "etc/jetson-edge/config.yaml").read_text(encoding="utf-8") == new
    assert not (dest / "etc/jetson-edge/config.yaml.dist").exists()


def test_installer_dry_run_changes_nothing(tmp_path):
    dest = tmp_path / "root"
    proc = run_install("--dry-run", destdir=dest)
    assert proc.returncode == 0 and "would run: install -m 0644" in proc.stdout
    assert not dest.exists()


def test_installer_dry_run_on_the_real_system_only_prints(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the real-system path needs root")
    try:
        pwd.getpwnam("jetson-edge")
        pytest.skip("a jetson-edge user exists here")
    except KeyError:
        pass
    env = {k: v for k, v in os.environ.items() if k != "DESTDIR"}
    proc = subprocess.run(["bash", INSTALL, "--dry-run"], capture_output=True,
                          encoding="utf-8", errors="replace", env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "would run: useradd --system" in proc.stdout
    with pytest.raises(KeyError):
        pwd.getpwnam("jetson-edge")  # nothing was created
    assert not os.path.exists("/etc/systemd/system/jetson-edge.service") or "unchanged" in proc.stdout


def test_installer_rejects_bad_options(tmp_path):
    assert run_install("--bogus", destdir=tmp_path).returncode == 2
    assert run_install("--prefix", "relative/path", destdir=tmp_path).returncode == 2


# systemd-analyze security --offline=true: 8.2 EXPOSED before issue 10, 1.9 OK after, 2.1 since issue 20 item 6
# dropped PrivateTmp= (+0.2) so that a restarted nvargus-daemon's new /tmp/argus_socket is reachable.
EXPOSURE_MAX = 2.1


def test_unit_exposure_score_does_not_rise():
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd; scripts/bootstrap.sh --dev as root)")
    proc = subprocess.run([analyze, "security", "--offline=true", "--no-pager", UNIT], capture_output=True,
                          encoding="utf-8", errors="replace", timeout=60)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout + proc.stderr)
    assert match, proc.stdout + proc.stderr
    assert float(match.group(1)) <= EXPOSURE_MAX, proc.stdout
    keys = {k for _, k, _ in unit_settings()}
    assert not {"PrivateDevices", "MemoryDenyWriteExecute", "DevicePolicy", "DeviceAllow", "ProtectClock"} & keys
    assert "PrivateTmp" not in keys and "argus_socket" not in " ".join(v for _, _, v in unit_settings())
    assert get("CapabilityBoundingSet") == "" and "AF_UNIX" in get("RestrictAddressFamilies")


HOSTILE_PREFIXES = ["/srv/my edge", "/x&y", "/x|;e touch {marker};s|y|", "/a\\b", "/srv/$(touch {marker})",
                    "/srv/`touch {marker}`", "/srv/../etc", "/srv//edge", "relative/path", "/srv/edge\nExecStartPre=/x",
                    "/srv/'q'", "/srv/edge;rm"]


@pytest.mark.parametrize("prefix", HOSTILE_PREFIXES)
@pytest.mark.parametrize("dry_run", [True, False])
def test_installer_refuses_a_hostile_prefix_and_changes_nothing(tmp_path, prefix, dry_run):
    marker = tmp_path / "P"
    dest = tmp_path / "root"
    args = (["--dry-run"] if dry_run else []) + ["--prefix", prefix.format(marker=marker)]
    proc = run_install(*args, destdir=dest)
    assert proc.returncode == 2 and "--prefix must be an absolute path" in proc.stderr, proc.stdout + proc.stderr
    assert not marker.exists() and not dest.exists()


def test_installer_accepts_a_plain_prefix_with_a_trailing_slash(tmp_path):
    dest = tmp_path / "root"
    assert run_install("--prefix", "/srv/edge-1.2_x/", destdir=dest).returncode == 0
    unit = (dest / "etc/systemd/system/jetson-edge.service").read_text(encoding="utf-8")
    assert "ExecStart=/srv/edge-1.2_x/.venv/bin/edge run --config" in unit


def test_installer_refuses_to_write_through_a_planted_symlink(tmp_path):
    for planted in ("etc/jetson-edge/.config.yaml.installed-sha256", "etc/jetson-edge", "etc/systemd/system"):
        base = tmp_path / planted.replace("/", "_")
        base.mkdir()
        dest, target = base / "root", base / "victim"
        target.write_text("precious", encoding="utf-8") if "." in planted else target.mkdir()
        link = dest / planted
        link.parent.mkdir(parents=True)
        link.symlink_to(target)
        proc = run_install(destdir=dest)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "refusing to write through the symbolic link {}".format(link) in proc.stderr
        assert (target.read_text(encoding="utf-8") == "precious") if target.is_file() else list(target.iterdir()) == []
        assert not (dest / "etc/jetson-edge/config.yaml").exists() or planted == "etc/systemd/system"


def test_installer_prefix_root_gives_one_slash(tmp_path):
    dest = tmp_path / "root"
    assert run_install("--prefix", "/", destdir=dest).returncode == 0
    unit = (dest / "etc/systemd/system/jetson-edge.service").read_text(encoding="utf-8")
    assert "ExecStart=/.venv/bin/edge run --config" in unit and "//.venv" not in unit


# A client that sees "/tmp" the way the service would (the unit's directives applied in a private mount namespace:
# `service_tmp` stands for the service's /tmp, `host_tmp` for the host's), connects to the Argus socket, waits
# until told the daemon restarted, and connects again. Prints each reply or the error.
_CLIENT = r"""
import socket, subprocess, sys
host_tmp, service_tmp, private_tmp, binds = sys.argv[1], sys.argv[2], sys.argv[3] == "yes", sys.argv[4:]
def mount(*args):
    subprocess.run(["mount"] + list(args), check=True)
if private_tmp:  # an empty private /tmp; BindReadOnlyPaths= entries under /tmp bound into it
    for bind in binds:
        optional, path = bind.startswith("-"), bind.lstrip("-")
        source = path.replace("/tmp", host_tmp, 1)
        target = path.replace("/tmp", service_tmp, 1)
        try:
            open(target, "a").close()
            mount("--bind", source, target)
            mount("-o", "remount,bind,ro", target)
        except (OSError, subprocess.CalledProcessError):
            if not optional:
                raise
else:  # the host's /tmp, read-only (ProtectSystem=strict)
    mount("--bind", host_tmp, service_tmp)
    mount("-o", "remount,bind,ro", service_tmp)
def ask():
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(service_tmp + "/argus_socket")
        return sock.recv(64).decode()
    except OSError as exc:
        return "error " + (exc.strerror or type(exc).__name__)
    finally:
        sock.close()
print(ask(), flush=True)
sys.stdin.readline()  # the daemon restarted
print(ask(), flush=True)
"""


class ArgusLike:
    """A daemon serving a Unix socket at `path` that answers its generation; restart() makes a new socket."""

    def __init__(self, path):
        self.path, self.generation, self.sock = path, 0, None
        self.restart()

    def restart(self):
        self.close()
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.generation += 1
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(self.path)
        self.sock.listen(4)
        threading.Thread(target=self._serve, args=(self.sock, self.generation), daemon=True).start()

    @staticmethod
    def _serve(sock, generation):
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.sendall("daemon {}".format(generation).encode())
            conn.close()

    def close(self):  # as the daemon's exit would: shutdown() also ends the accept() blocked in the thread
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()


def argus_restart_seen_by(tmp_path, private_tmp, binds):
    """(reply before, reply after) a restart of the daemon, for a client under that /tmp layout."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    host_tmp, service_tmp = tmp_path / "host-tmp", tmp_path / "service-tmp"
    host_tmp.mkdir()
    service_tmp.mkdir()
    daemon = ArgusLike(str(host_tmp / "argus_socket"))
    client = subprocess.Popen(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _CLIENT,
                               str(host_tmp), str(service_tmp), private_tmp] + binds,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, encoding="utf-8", errors="replace")
    try:
        before = client.stdout.readline().strip()
        daemon.restart()
        client.stdin.write("restarted\n")
        client.stdin.flush()
        after = client.stdout.readline().strip()
        assert client.wait(timeout=30) == 0
    finally:
        client.kill()
        daemon.close()
    return before, after


def test_a_restarted_argus_daemon_is_reached_through_the_units_tmp_layout(tmp_path):
    keys = {k for _, k, _ in unit_settings()}
    private = "yes" if "PrivateTmp" in keys and get("PrivateTmp") == "yes" else "no"
    binds = [v for _, k, v in unit_settings() if k in ("BindReadOnlyPaths", "BindPaths")]
    assert argus_restart_seen_by(tmp_path, private, binds) == ("daemon 1", "daemon 2")


def test_a_private_tmp_with_the_socket_file_bound_keeps_the_dead_socket(tmp_path):
    # the layout before issue 20 item 6: the emulation above does tell the two apart
    before, after = argus_restart_seen_by(tmp_path, "yes", ["-/tmp/argus_socket"])
    assert before == "daemon 1" and after.startswith("error")


JTOP_PIN = "7.2.2"


def jtop_unit_template():
    """jetson-stats' own jtop.service, as `jtop --install-service` installs it, from the venv's jetson-stats."""
    from importlib import metadata

    try:
        dist = metadata.distribution("jetson-stats")
    except metadata.PackageNotFoundError:
        pytest.skip("jetson-stats not installed (pip install -e '.[jetson]' -c constraints/jetpack6.txt)")
    assert dist.version == JTOP_PIN, "the venv's jetson-stats is {}, the constraints pin {}".format(
        dist.version, JTOP_PIN)
    unit, = [f for f in dist.files if f.name == "jtop.service"]
    return open(str(dist.locate_file(unit)), encoding="utf-8").read()


def boot_order(tmp_path, jtop_unit, extra=None):
    """systemd-analyze verify of multi-user.target with jetson-edge.service and `jtop_unit` installed and enabled
    (its .wants links) under a unit path of their own, the jtop drop-in applied: what systemd says at boot."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd; scripts/bootstrap.sh --dev as root)")
    units = tmp_path / "units"
    (units / "multi-user.target.wants").mkdir(parents=True)
    (units / "jtop.service.d").mkdir()
    ours = open(UNIT, encoding="utf-8").read().replace("/opt/jetson-edge/.venv/bin/edge", "/bin/true")
    (units / "jetson-edge.service").write_text(ours, encoding="utf-8")
    (units / "jtop.service").write_text(jtop_unit, encoding="utf-8")
    dropin = open(os.path.join(REPO, "systemd", "jtop.service.d", "jetson-edge.conf"), encoding="utf-8").read()
    (units / "jtop.service.d" / "jetson-edge.conf").write_text(
        dropin.replace("/opt/jetson-edge/.venv/bin/jtop", "/bin/true"), encoding="utf-8")
    for name, text in (extra or {}).items():
        (units / name).write_text(text, encoding="utf-8")
    for name in ["jetson-edge.service", "jtop.service"] + list(extra or {}):
        os.symlink(os.path.join("..", name), str(units / "multi-user.target.wants" / name))
    proc = subprocess.run([analyze, "verify", "multi-user.target", "jetson-edge.service"], capture_output=True,
                          encoding="utf-8", errors="replace", cwd=str(tmp_path),
                          env=dict(os.environ, SYSTEMD_UNIT_PATH=str(units) + ":"))
    return proc.stdout + proc.stderr


def test_the_pinned_jtop_unit_and_ours_boot_without_an_ordering_cycle(tmp_path):
    """Issue 42 item 7: jetson-stats 7.2.2 (pinned in every constraints file) orders jtop.service after
    systemd-modules-load.service; a jtop.service ordered After=multi-user.target (other versions) makes a cycle
    with our After=jtop.service, and systemd deletes a start job at boot: the same check finds it."""
    for jetpack in ("jetpack5", "jetpack6", "jetpack7"):
        lines = open(os.path.join(REPO, "constraints", jetpack + ".txt"), encoding="utf-8").read().splitlines()
        assert "jetson-stats==" + JTOP_PIN in lines, jetpack
    template = jtop_unit_template()
    out = boot_order(tmp_path / "pinned", template)
    assert "ordering cycle" not in out and "jetson-edge" not in out and "jtop" not in out, out
    cyclic = re.sub(r"^After=.*$", "After=multi-user.target", template, flags=re.M)
    assert cyclic != template
    out = boot_order(tmp_path / "other", cyclic)
    assert "Found ordering cycle" in out and "deleted to break ordering cycle" in out, out


def test_jtop_service_runs_the_venvs_jtop_and_the_container_default_matches_it():
    """The drop-in replaces jetson-stats' ExecStart=/usr/local/bin/jtop (never installed by the recipe, or another
    version) with the venv's jtop, under --prefix; the container's default jetson-stats satisfies setup.py's pin, so
    its client talks to the jtop.service the installer sets up on the node."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    dropin = os.path.join(REPO, "systemd", "jtop.service.d", "jetson-edge.conf")
    lines = [line for line in open(dropin, encoding="utf-8").read().splitlines() if line and not line.startswith("#")]
    assert lines == ["[Service]", "ExecStart=", "ExecStart=/opt/jetson-edge/.venv/bin/jtop --force"]
    setup = open(os.path.join(REPO, "setup.py"), encoding="utf-8").read()
    spec = re.search(r'"jetson": \[[^]]*"jetson-stats([^"]+)"', setup).group(1)
    dockerfile = open(os.path.join(REPO, "deploy", "container", "Dockerfile"), encoding="utf-8").read()
    default = re.search(r"^ARG JTOP_VERSION=(\S+)$", dockerfile, re.M).group(1)
    assert Version(default) in SpecifierSet(spec), (default, spec)


def power_mode_run(tmp_path, conf, want, current):
    """install_service.sh's set_power_mode (sourced, as tests/test_install_recipe.py runs the recipe's parts) for
    `--power-mode want` on a board's own nvpmodel.conf, with an `nvpmodel` on PATH that answers `-q` with `current`
    and logs each call and what it read on stdin."""
    bin_dir, log = tmp_path / "bin", tmp_path / "nvpmodel.log"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvpmodel"
    fake.write_text('#!/bin/sh\nif [ "$1" = -q ]; then echo "NV Power Mode: X"; echo {}; exit 0; fi\n'
                    'read answer; echo "$* <$answer" >> {}\n'.format(current, log), encoding="utf-8")
    fake.chmod(0o755)
    conf_path = os.path.join(REPO, "tests", "nvpmodel", conf)
    proc = subprocess.run(["bash", "-c", 'source "$1"; power_mode="$2"; set_power_mode "$3" "$4"', "bash", INSTALL,
                           want, sys.executable, conf_path], capture_output=True, encoding="utf-8", errors="replace",
                          env=dict(os.environ, PATH="{}:{}".format(bin_dir, os.environ["PATH"])), timeout=60)
    calls = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return proc, calls


@pytest.mark.parametrize("conf, want, expected", [
    ("xavier_nx_r35.conf", "max", "-m 8 <NO"),  # MODE_20W_6CORE, not mode 0 (MODE_15W_2CORE)
    ("orin_nano_8gb_super_r36.conf", "max", "-m 2 <NO"),  # MAXN_SUPER
    ("agx_orin_64gb_r36.conf", "max", "-m 0 <NO"),  # MAXN
    ("xavier_nx_r35.conf", "7", "-m 7 <NO"),
])
def test_installer_sets_the_power_mode_once_and_never_reboots(tmp_path, conf, want, expected):
    """Issue 42 item 5: `--power-mode max` is the board's maximum as edge.board judges it; nvpmodel's reboot
    question is answered no; a board already in that mode is left alone."""
    proc, calls = power_mode_run(tmp_path, conf, want, current=1)
    assert proc.returncode == 0 and calls == [expected], proc.stdout + proc.stderr
    assert "if nvpmodel asks for a reboot, reboot to apply it" in proc.stdout
    (tmp_path / "again").mkdir()
    again, calls = power_mode_run(tmp_path / "again", conf, want, current=expected.split()[1])
    assert again.returncode == 0 and calls == [] and "already set" in again.stdout, again.stdout + again.stderr


def test_installer_refuses_a_power_mode_the_board_does_not_have(tmp_path):
    proc, calls = power_mode_run(tmp_path, "xavier_nx_r35.conf", "9", current=2)
    assert proc.returncode == 2 and calls == []
    assert "--power-mode 9: no such mode in " in proc.stderr and "MODE_20W_6CORE (8)" in proc.stderr
    refused = run_install("--power-mode", "fast", destdir=tmp_path / "stage")
    assert refused.returncode == 2 and "--power-mode is max or a mode ID" in refused.stderr
    assert not (tmp_path / "stage").exists()  # refused before anything is written
    staged = run_install("--power-mode", "max", destdir=tmp_path / "stage")
    assert staged.returncode == 0 and "staged: --power-mode max is set on the device itself" in staged.stdout


def test_the_clocks_unit_pins_clocks_once_between_jtop_and_the_service(tmp_path):
    """jetson-edge-clocks.service (--clocks): a oneshot after nvpmodel.service and jtop.service, before
    jetson-edge.service; systemd-analyze verifies it, and booting with it, ours and jtop's enabled has no cycle."""
    clocks = os.path.join(REPO, "systemd", "jetson-edge-clocks.service")
    settings = {(s, k): v for s, k, v in unit_settings(clocks)}
    assert settings[("Service", "Type")] == "oneshot" and settings[("Service", "RemainAfterExit")] == "yes"
    assert set(settings[("Unit", "After")].split()) == {"nvpmodel.service", "jtop.service"}
    assert settings[("Unit", "Before")] == "jetson-edge.service"
    assert settings[("Service", "ExecStart")] == "/usr/bin/jetson_clocks"
    out = boot_order(tmp_path, jtop_unit_template(), extra={"jetson-edge-clocks.service": open(
        clocks, encoding="utf-8").read().replace("/usr/bin/jetson_clocks", "/bin/true")})
    assert "ordering cycle" not in out and "jetson-edge" not in out, out
    plain = run_install(destdir=tmp_path / "plain")  # optional: not installed without --clocks
    assert plain.returncode == 0
    assert not (tmp_path / "plain" / "etc" / "systemd" / "system" / "jetson-edge-clocks.service").exists()
    staged = run_install("--clocks", destdir=tmp_path / "stage")
    assert staged.returncode == 0, staged.stdout + staged.stderr
    installed = tmp_path / "stage" / "etc" / "systemd" / "system" / "jetson-edge-clocks.service"
    assert installed.read_text(encoding="utf-8") == open(clocks, encoding="utf-8").read()


def test_the_engine_unit_builds_only_when_needed_beside_a_serving_service():
    """jetson-edge-engine.service: skipped by its condition unless the engine is missing or stale, never ordered
    before the service (which serves on the CPU meanwhile), and reloads the service onto what it built."""
    settings = [(s, k, v) for s, k, v in unit_settings(ENGINE_UNIT)]
    values = {k: v for _, k, v in settings}
    assert values["Type"] == "oneshot" and values["User"] == "jetson-edge"
    assert "--needed" in values["ExecCondition"] and "--needed" not in values["ExecStart"]
    assert values["ExecStartPost"].startswith("+") and "try-reload-or-restart jetson-edge.service" in values[
        "ExecStartPost"]
    assert "jetson-edge.service" not in values.get("Before", "") and values["TimeoutStartSec"] == "3h"
