"""edge/fleet/statedir.py and the release state it guards (issue 39): root's settle unit runs nothing, and writes,
creates, truncates or deletes nothing, through a link or a name that anyone but root can plant. Each planted link
and each forged name is refused in one line naming the path; the service user (uid 65534 here, through setpriv)
cannot plant anything in the state, and a link it plants where it may write (engines/) is never followed."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from edge.errors import EdgeError
from edge.fleet.releases import Device
from edge.fleet.statedir import StateDir

SERVICE_USER = 65534


@pytest.fixture
def base():
    """A folder under /tmp that another uid can traverse (pytest's own tmp_path is root's 0700)."""
    path = tempfile.mkdtemp(prefix="edge-statedir-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_state(base):
    """A device's release state as deploy/ansible leaves it: r1 committed and current, r2 beside it."""
    state = os.path.join(base, "state")
    for name in ("r1", "r2"):
        folder = os.path.join(state, "releases", name)
        os.makedirs(os.path.join(folder, "models"))
        os.makedirs(os.path.join(folder, "engines"))
        with open(os.path.join(folder, "models", "m.onnx"), "w", encoding="utf-8") as fh:
            fh.write(name)
        with open(os.path.join(folder, "config.yaml"), "w", encoding="utf-8") as fh:
            fh.write("service:\n  metrics:\n    enabled: true\n    host: 127.0.0.1\n    port: 9\n")
        os.symlink(sys.prefix, os.path.join(folder, "venv"))
    with open(os.path.join(state, "releases", "r1", "GATED"), "w", encoding="utf-8") as fh:
        json.dump({"release": "r1", "armed_at": "2026-01-01T00:00:00Z"}, fh)
    for link in ("current", "committed"):
        os.symlink("releases/r1", os.path.join(state, link))
    with open(os.path.join(state, "rollout.json"), "w", encoding="utf-8") as fh:
        json.dump({"device": "dev-1", "keep": 0}, fh)
    os.makedirs(os.path.join(base, "bin"))
    with open(os.path.join(base, "bin", "systemctl"), "w", encoding="utf-8") as fh:
        fh.write("#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/calls\"\n")
    os.chmod(os.path.join(base, "bin", "systemctl"), 0o755)
    return state


def edge(base, *args):
    env = dict(os.environ, PATH=os.path.join(base, "bin") + os.pathsep + os.environ["PATH"])
    return subprocess.run([sys.executable, "-m", "edge", "release"] + list(args) + [
        "--state", os.path.join(base, "state"), "--by", "root@dev"], capture_output=True, encoding="utf-8",
        errors="replace", timeout=120, env=env)


def refused_in_one_line(proc, path):
    lines = proc.stderr.strip().splitlines()
    return proc.returncode == 2 and len(lines) == 1 and path in lines[0] and "refused" in lines[0]


def victim(base):
    path = os.path.join(base, "victim")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("root's file\n")
    return path


def plant(path, target):
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)


@pytest.mark.parametrize("name, args", [
    ("audit.log", ["fail", "r2", "--why", "x"]),  # appended through the link
    (".lock", ["try", "r2", "--no-wait"]),  # created through the link
    ("releases/r1/GATED", ["try", "r1"]),  # read (and truncated by a commit) through the link
    ("refused", ["fail", "r2", "--why", "x"]),  # a record written through a linked folder
])
def test_each_planted_link_is_refused_in_one_line_and_nothing_is_written_through_it(base, name, args):
    state = make_state(base)
    target = victim(base) if name != "refused" else (victim(base) and base)
    plant(os.path.join(state, name), target)
    proc = edge(base, *args)
    assert refused_in_one_line(proc, os.path.join(state, name)), proc.stdout + proc.stderr
    with open(os.path.join(base, "victim"), encoding="utf-8") as fh:
        assert fh.read() == "root's file\n"
    assert not os.path.exists(os.path.join(base, "r2.json"))


@pytest.mark.parametrize("link, target", [("current", "/etc"), ("committed", "releases/../../etc"),
                                          ("current", "releases/r1/../../../x")])
def test_a_switch_link_that_points_anywhere_but_a_release_is_refused(base, link, target):
    state = make_state(base)
    plant(os.path.join(state, link), target)
    proc = edge(base, "status")
    assert refused_in_one_line(proc, os.path.join(state, link)), proc.stderr
    assert "not a link as the store writes it" in proc.stderr


@pytest.mark.parametrize("field, value", [("release", "../../etc"), ("fallback", "../../../etc"),
                                          ("fallback", "r1\x1b[2J")])
def test_a_forged_name_in_trial_json_is_refused_and_nothing_switches(base, field, value):
    state = make_state(base)
    trial = {"release": "r2", "fallback": "r1", "sha256": "", "armed_at": "t", "by": "x", "retry": False}
    trial[field] = value
    with open(os.path.join(state, "trial.json"), "w", encoding="utf-8") as fh:
        json.dump(trial, fh)
    proc = edge(base, "settle")
    assert proc.returncode == 2 and "trial.json: {}".format(field) in proc.stderr, proc.stdout + proc.stderr
    assert "\x1b" not in proc.stderr and os.readlink(os.path.join(state, "current")) == "releases/r1"
    assert not os.path.exists(os.path.join(base, "bin", "calls"))  # no systemctl ran


@pytest.mark.parametrize("key, value", [("service", "--now"), ("settle_unit", "x.service; reboot"),
                                        ("service", "getty@tty1.socket"), ("store", "relative/cache"),
                                        ("store", "/srv/../etc"), ("device", "dev\n1"), ("bake_s", -1),
                                        ("keep", 1.5), ("max_miss_ratio", 2), ("interval_s", True)])
def test_a_forged_setting_in_rollout_json_is_refused_in_one_line(base, key, value):
    state = make_state(base)
    with open(os.path.join(state, "rollout.json"), "w", encoding="utf-8") as fh:
        json.dump({key: value}, fh)
    proc = edge(base, "settle")
    assert proc.returncode == 2 and "rollout.json: '{}'".format(key) in proc.stderr, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not os.path.exists(os.path.join(base, "bin", "calls"))


def test_prune_never_removes_through_a_link(base):
    """A release's venv link to a folder that is not root's alone, and a link inside engines/ (the service user's),
    are removed as links; what they point at stays."""
    state = make_state(base)
    outside = os.path.join(base, "outside", "venvs", "v")
    os.makedirs(outside)
    os.chmod(os.path.dirname(outside), 0o777)  # a venvs folder anyone can write: not root's alone
    open(os.path.join(outside, "keep"), "w", encoding="utf-8").close()
    plant(os.path.join(state, "releases", "r2", "venv"), outside)
    os.symlink(os.path.join(base, "outside"), os.path.join(state, "releases", "r2", "engines", "x"))
    assert Device(state).prune("root@dev") == ["r2"]
    assert os.path.exists(os.path.join(outside, "keep")) and not os.path.exists(os.path.join(state, "releases", "r2"))


def test_a_link_in_the_path_of_the_state_is_refused(base):
    state = make_state(base)
    os.symlink(state, os.path.join(base, "via-link"))
    with pytest.raises(EdgeError, match="via-link: a symbolic link"):
        Device(os.path.join(base, "via-link"))
    os.chmod(state, 0o775)
    with pytest.raises(EdgeError, match="writable by its group or others"):
        StateDir.open(state)


def as_service_user(*argv):
    return subprocess.run(["setpriv", "--reuid", str(SERVICE_USER), "--regid", str(SERVICE_USER), "--clear-groups",
                           "--"] + list(argv), capture_output=True, encoding="utf-8", errors="replace", timeout=60)


needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to act as the service user")


@needs_root
def test_the_service_user_cannot_plant_in_the_state_and_its_engines_links_are_not_followed(base):
    state = make_state(base)
    engines = os.path.join(state, "releases", "r2", "engines")
    os.chown(engines, SERVICE_USER, SERVICE_USER)
    for name in ("audit.log", ".lock", "current", "releases/r1/GATED", "releases/r1/venv"):
        proc = as_service_user("ln", "-sfn", "/etc", os.path.join(state, name))
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, (name, proc.stderr)
    secret = victim(base)
    proc = as_service_user("ln", "-s", secret, os.path.join(engines, "model.engine"))
    assert proc.returncode == 0, proc.stderr
    assert as_service_user("ln", "-s", base, os.path.join(engines, "all")).returncode == 0
    assert Device(state).prune("root@dev") == ["r2"]
    assert os.path.exists(secret) and os.path.isdir(os.path.join(base, "state", "releases", "r1"))


@needs_root
@pytest.mark.parametrize("name", ["audit.log", ".lock", "committed", "trial.json"])
def test_a_state_the_service_user_owns_is_refused_by_root_in_one_line(base, name):
    """The old layout: /var/lib/jetson-edge was the service's StateDirectory, owned by its user, who planted links
    there that root's settle followed."""
    state = make_state(base)
    for parent, dirs, files in os.walk(state):
        for entry in dirs + files + [""]:
            os.lchown(os.path.join(parent, entry), SERVICE_USER, SERVICE_USER)
    proc = as_service_user("ln", "-sfn", victim(base), os.path.join(state, name))
    assert proc.returncode == 0, proc.stderr
    for args in (["settle"], ["status"], ["withdraw", "r1"]):
        out = edge(base, *args)
        assert refused_in_one_line(out, state) and "owned by uid {}".format(SERVICE_USER) in out.stderr, out.stderr
    with open(os.path.join(base, "victim"), encoding="utf-8") as fh:
        assert fh.read() == "root's file\n"
    assert not os.path.exists(os.path.join(base, "bin", "calls"))


def test_a_record_cannot_forge_audit_lines_or_reach_a_terminal(base):
    """A store record whose `why` holds a newline, a fake `commit:` line and an ESC sequence: the device's audit
    entry stays one line, and the refusal line carries no control character."""
    state = make_state(base)
    store = os.path.join(base, "store")
    os.makedirs(os.path.join(store, "rollout"))
    with open(os.path.join(state, "rollout.json"), "w", encoding="utf-8") as fh:
        json.dump({"store": store, "device": "dev-1"}, fh)
    forged = "camera\n2026-01-01T00:00:00Z settle@dev commit: r9 (fake)\x1b[2J\x1b]0;owned\x07"
    with open(os.path.join(store, "rollout", "r1.json"), "w", encoding="utf-8") as fh:
        json.dump({"release": "r1", "state": "withdrawn", "why": forged, "by": "bob\x1b[31m@ctl"}, fh)
    check = edge(base, "check", "r1")
    assert check.returncode == 2 and len(check.stderr.strip().splitlines()) == 1, check.stderr
    assert "\x1b" not in check.stderr and "\x07" not in check.stderr and "\\x1b[2J" in check.stderr
    settle = edge(base, "settle")
    assert settle.returncode == 0, settle.stderr
    with open(os.path.join(state, "audit.log"), encoding="utf-8") as fh:
        audit = fh.read()
    assert audit.count("\n") == 1 and "\x1b" not in audit and "\\x0a2026-01-01T00:00:00Z settle@dev commit: r9" in \
        audit, audit
    assert not any(line.split(" ", 2)[2].startswith("commit:") for line in audit.splitlines())
