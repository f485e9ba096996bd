"""`edge release` on one device root (tests/fleet/systemctl runs the real `edge run` of `current` as the unit would,
and `edge release settle` detached as the settle unit would): a switch arms its fallback first, the bake reads the
real daemon's metrics and commits or falls back by itself, withdrawn and failed releases stay out (here and in the
shared store), and every crash point between two steps settles to the old or the new release."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import service_helpers as sh
import yaml
from store_helpers import kill_points, killed

HERE = os.path.dirname(os.path.abspath(__file__))
STATE = os.path.join("var", "lib", "jetson-edge-release")
BAKE = {"bake_s": 1.5, "start_timeout_s": 90, "interval_s": 0.25, "max_miss_ratio": 0.05, "keep": 1}


class Device:
    """A device root: releases written as deploy/ansible writes them, the stand-in systemctl first on PATH."""

    def __init__(self, root, model, store):
        self.root, self.model, self.store = str(root), model, str(store)
        self.state = os.path.join(self.root, STATE)
        os.makedirs(os.path.join(self.state, "releases"))
        os.makedirs(os.path.join(self.root, "bin"))
        shutil.copy(os.path.join(HERE, "fleet", "systemctl"), os.path.join(self.root, "bin", "systemctl"))
        os.makedirs(os.path.join(self.root, "opt", "jetson-edge"))
        os.symlink(sys.prefix, os.path.join(self.root, "opt", "jetson-edge", ".venv"))  # the settle unit's program
        open(os.path.join(self.root, "live"), "w", encoding="utf-8").close()
        self.port = sh.free_port()
        self.settings(store=self.store, device="dev-1", **BAKE)

    def settings(self, **values):
        with open(os.path.join(self.state, "rollout.json"), "w", encoding="utf-8") as fh:
            json.dump(values, fh)

    def release(self, name, budget_ms=10000.0):
        folder = os.path.join(self.state, "releases", name)
        os.makedirs(os.path.join(folder, "models"))
        for suffix in (".onnx", ".labels.txt", ".json"):
            shutil.copy(self.model[:-len(".onnx")] + suffix, os.path.join(folder, "models"))
        os.symlink(sys.prefix, os.path.join(folder, "venv"))
        sh.write_config(os.path.join(folder, "config.yaml"), {
            "model": {"path": os.path.join(folder, "models", os.path.basename(self.model))},
            "source": {"uri": "synthetic", "width": 160, "height": 120, "fps": 20},
            "backend": dict(sh.QUIET_ORT, kind="onnxruntime"), "preprocess": {"device": "cpu"},
            "runtime": {"budget_ms": budget_ms, "warmup": 1},
            "service": {"metrics": {"enabled": True, "host": "127.0.0.1", "port": self.port},
                        "telemetry": {"enabled": False}}})
        with open(os.path.join(folder, "release.env"), "w", encoding="utf-8") as fh:
            fh.write("EDGE_RELEASE={}\n".format(name))

    def argv(self, *args):
        """`edge release ARGS` on this device, and its environment (the stand-in systemctl first on PATH)."""
        env = dict(os.environ, PATH=os.path.join(self.root, "bin") + os.pathsep + os.environ["PATH"])
        wait = ["--timeout", "150"] if args[0] == "try" and "--no-wait" not in args else []
        return [sys.executable, "-m", "edge", "release"] + list(args) + wait + \
            ["--state", self.state, "--by", "alice@ctl"], env

    def edge(self, *args, timeout=300):
        argv, env = self.argv(*args)
        return subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace", timeout=timeout, env=env)

    def lines(self, name):
        """<root>/`name` (the stand-in's service.log, show.log), one entry a line."""
        path = os.path.join(self.root, name)
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()

    def link(self, name):
        path = os.path.join(self.state, name)
        return os.path.basename(os.readlink(path)) if os.path.islink(path) else None

    def serving(self):
        """The release the running daemon reports on its own metrics endpoint (None: nothing serves)."""
        from edge.fleet.health import scrape

        sample = scrape("http://127.0.0.1:{}/metrics".format(self.port))
        return sample.release if sample else None

    def serves(self, release, timeout=90):
        """Waits until the daemon answers for `release` (a restart takes a few seconds)."""
        return sh.wait_until(lambda: self.serving() == release, timeout, 0.2)

    def audit(self):
        with open(os.path.join(self.state, "audit.log"), encoding="utf-8") as fh:
            return fh.read().splitlines()

    def settled(self, timeout=120):
        return sh.wait_until(lambda: not os.path.exists(os.path.join(self.state, "trial.json")), timeout, 0.1)

    def stop(self):
        env = dict(os.environ, PATH=os.path.join(self.root, "bin") + os.pathsep + os.environ["PATH"])
        subprocess.run(["systemctl", "stop", "jetson-edge.service"], env=env, check=True, timeout=60)


@pytest.fixture
def device(tmp_path, small_model):
    (tmp_path / "store").mkdir()
    dev = Device(tmp_path / "host", small_model, tmp_path / "store")
    yield dev
    dev.stop()


def record(dev, release):
    with open(os.path.join(dev.store, "rollout", release + ".json"), encoding="utf-8") as fh:
        return json.load(fh)


def test_a_release_is_baked_on_its_own_metrics_then_committed_or_left_by_the_device(device):
    device.release("r1")
    first = device.edge("try", "r1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert device.link("current") == device.link("committed") == "r1" and device.serves("r1")
    assert "commit: r1 (1.5 s bake:" in device.audit()[-1] and "sha256 " in device.audit()[-1]

    device.release("r2", budget_ms=0.001)  # every frame misses: the bake fails on the live daemon
    failed = device.edge("try", "r2")
    assert failed.returncode == 1 and "miss ratio 1.0000 over 0.05" in failed.stdout, failed.stdout + failed.stderr
    assert device.link("current") == "r1" and device.serves("r1") and device.link("previous") is None
    assert record(device, "r2")["state"] == "failed" and record(device, "r2")["device"] == "dev-1"
    assert "back on r1" in device.audit()[-1]

    # refused from now on, here and on any device reading the store, until an explicit retry
    again = device.edge("try", "r2")
    assert again.returncode == 2 and "release r2 failed" in again.stderr and "--retry" in again.stderr
    assert device.link("current") == "r1" and device.serves("r1")
    os.unlink(os.path.join(device.state, "refused", "r2.json"))  # another device: only the store knows
    assert device.edge("check", "r2").returncode == 2

    device.release("r3")
    assert device.edge("try", "r3").returncode == 0 and device.serves("r3")
    # the kill switch on the device: recorded withdrawn, back on r1 (r3's fallback)
    kill = device.edge("withdraw", "r3", "--why", "camera faults")
    assert kill.returncode == 0 and device.link("current") == "r1" and device.serves("r1"), kill.stderr
    assert record(device, "r3")["state"] == "withdrawn" and "withdrawn: r3 (camera faults" in device.audit()[-1]
    assert not os.path.exists(os.path.join(device.state, "releases", "r2"))  # pruned (keep 1 besides the links)


def test_try_no_wait_returns_armed_and_status_reports_the_bakes_verdict(device):
    """Issue 43 (scale): `try` held its caller for the whole bake, so a batch of N devices cost N / forks bakes.
    `--no-wait` returns once armed and switched; the settle unit bakes and `status NAME` is what a play polls."""
    def verdict(name):
        proc = device.edge("status", name)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    device.release("r1")
    assert verdict("r1")["verdict"] == "none"
    device.settings(store=device.store, device="dev-1", **dict(BAKE, bake_s=4))
    armed = device.edge("try", "r1", "--no-wait")
    assert armed.returncode == 0 and "r1 switched" in armed.stdout, armed.stdout + armed.stderr
    # returned before the bake's verdict: read from the state folder at once (a `status` process may take longer
    # than the bake to start on a loaded machine)
    assert os.path.exists(os.path.join(device.state, "trial.json")) and device.link("committed") is None
    assert sh.wait_until(lambda: verdict("r1")["verdict"] != "baking", 120, 0.2)
    assert verdict("r1")["verdict"] == "committed" and device.link("committed") == "r1" and device.serves("r1")

    device.release("r2", budget_ms=0.001)  # every frame misses
    assert device.edge("try", "r2", "--no-wait").returncode == 0
    assert sh.wait_until(lambda: verdict("r2")["verdict"] != "baking", 120, 0.2)
    failed = verdict("r2")
    assert failed["verdict"] == "failed" and "miss ratio 1.0000 over 0.05" in failed["why"], failed
    assert device.link("current") == "r1" and device.serves("r1")


def test_a_device_offline_during_a_withdrawal_leaves_it_when_its_timer_fires(device):
    for name in ("r1", "r2"):
        device.release(name)
        assert device.edge("try", name).returncode == 0
    assert device.serves("r2")
    os.makedirs(os.path.join(device.store, "rollout"))
    with open(os.path.join(device.store, "rollout", "r2.json"), "w",
              encoding="utf-8") as fh:  # what the controller's kill switch wrote
        json.dump({"release": "r2", "state": "withdrawn", "why": "kill switch", "by": "bob@ctl"}, fh)
    settle = device.edge("settle")
    assert settle.returncode == 0 and "withdrawn r2, back on r1" in settle.stdout, settle.stdout + settle.stderr
    assert device.link("current") == "r1" and device.serves("r1")
    assert device.edge("settle").stdout.strip() == "edge release: r1 stays"


@pytest.mark.parametrize("cut", ["after arming", "after the switch", "inside the commit"])
def test_every_crash_point_settles_to_the_old_or_the_new_release(device, cut):
    device.release("r1")
    assert device.edge("try", "r1").returncode == 0
    device.release("r2")
    trial = {"release": "r2", "fallback": "r1", "sha256": "", "armed_at": "", "by": "alice@ctl", "retry": False}
    with open(os.path.join(device.state, "trial.json"), "w", encoding="utf-8") as fh:
        json.dump(trial, fh)
    if cut != "after arming":
        os.unlink(os.path.join(device.state, "current"))
        os.symlink("releases/r2", os.path.join(device.state, "current"))
        device.stop()
        subprocess.run([os.path.join(device.root, "bin", "systemctl"), "start", "jetson-edge.service"], check=True)
    if cut == "inside the commit":
        open(os.path.join(device.state, "releases", "r2", "GATED"), "w", encoding="utf-8").close()
    settle = device.edge("settle")
    assert settle.returncode == 0 and device.settled(), settle.stdout + settle.stderr
    expected = {"after arming": "r1"}.get(cut, "r2")
    assert device.link("current") == expected and device.serves(expected)


def test_rollout_settings_and_names_are_refused_in_one_line(device):
    device.settings(bake_s="long")
    proc = device.edge("status")
    assert proc.returncode == 2 and "rollout.json: 'bake_s' must be a number" in proc.stderr
    device.settings(**BAKE)
    proc = device.edge("try", "../etc")
    assert proc.returncode == 2 and "release '../etc': letters, digits" in proc.stderr
    assert yaml.safe_load(device.edge("status").stdout)["current"] is None


def test_a_cut_between_a_switch_and_its_restart_is_finished_by_the_timer(device):
    """`current` renamed, the restart never ran (a power cut, a failed systemctl): the timer's settle sees the
    daemon serve another release than `current` and restarts it."""
    for name in ("r1", "r2"):
        device.release(name)
        assert device.edge("try", name).returncode == 0
    os.unlink(os.path.join(device.state, "current"))
    os.symlink("releases/r1", os.path.join(device.state, "current"))
    assert device.serves("r2")
    settle = device.edge("settle")
    assert settle.returncode == 0 and "restarted on r1" in settle.stdout, settle.stdout + settle.stderr
    assert device.serves("r1") and "restart: the service ran r2, current is r1" in device.audit()[-1]


def test_the_settle_unit_and_its_timer_verify(tmp_path):
    """systemd's own check of the units deploy/ansible installs (run for real under systemd: docs/fleet.md). The
    settle unit runs as root the installed program under /opt, never one under a state folder (issue 39)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian: apt-get install systemd)")
    units = [os.path.join(os.path.dirname(HERE), "systemd", name)
             for name in ("jetson-edge-release.service", "jetson-edge-release.timer")]
    with open(units[0], encoding="utf-8") as fh:
        unit = fh.read()
    exec_start = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start == ["ExecStart=/opt/jetson-edge/.venv/bin/edge release settle --state "
                          "/var/lib/jetson-edge-release --by settle@%H"]
    assert "StateDirectory=jetson-edge-release\n" in unit and "StateDirectoryMode=0755" in unit
    copy = tmp_path / "jetson-edge-release.service"  # verify checks that ExecStart= exists
    copy.write_text(unit.replace("/opt/jetson-edge/.venv/bin/edge", os.path.join(os.path.dirname(sys.executable),
                                                                               "edge")), encoding="utf-8")
    shutil.copy(units[1], str(tmp_path))
    proc = subprocess.run([tool, "verify", str(copy), str(tmp_path / "jetson-edge-release.timer")],
                          capture_output=True, encoding="utf-8", errors="replace", timeout=60)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def exposure(unit):
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", unit], capture_output=True,
                          encoding="utf-8", errors="replace", timeout=60)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout + proc.stderr)
    assert match, proc.stdout + proc.stderr
    return float(match.group(1))


def test_the_root_settle_unit_is_no_more_exposed_than_the_service():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (Debian: apt-get install systemd)")
    systemd = os.path.join(os.path.dirname(HERE), "systemd")
    assert exposure(os.path.join(systemd, "jetson-edge-release.service")) <= exposure(
        os.path.join(systemd, "jetson-edge.service"))


def test_the_kill_switch_reaches_a_release_in_the_middle_of_its_bake(device):
    device.release("r1")
    assert device.edge("try", "r1").returncode == 0
    device.settings(store=device.store, device="dev-1", **dict(BAKE, bake_s=600))  # a bake that outlasts the test
    device.release("r2")
    assert device.edge("try", "r2", "--no-wait").returncode == 0
    assert device.serves("r2")  # baking: the trial is armed, the daemon serves r2
    assert os.path.exists(os.path.join(device.state, "trial.json"))
    kill = device.edge("withdraw", "r2", "--why", "camera faults")
    assert kill.returncode == 0, kill.stdout + kill.stderr
    assert device.settled() and device.link("current") == "r1" and device.serves("r1")
    assert re.search(r"withdrawn: r2 \(camera faults, sha256 \w+\), back on r1$", device.audit()[-1])
    assert not any("commit: r2" in line for line in device.audit())


def test_a_retry_of_a_release_committed_then_withdrawn_bakes_again(device):
    """Issue 39: GATED from r2's first commit survived its withdrawal, so `try r2 --retry` committed it at once
    ("committed before"), with no bake, and cleared the fleet's record. GATED names the trial that committed it:
    the retry bakes, and the record is cleared only once that bake passed. After the withdrawal `committed` no
    longer names r2 (the settle unit and a fallback never take it for good)."""
    for name in ("r1", "r2"):
        device.release(name)
        assert device.edge("try", name).returncode == 0
    kill = device.edge("withdraw", "r2", "--why", "camera faults")
    assert kill.returncode == 0 and device.link("current") == "r1" and device.serves("r1"), kill.stderr
    assert device.link("committed") == "r1" and record(device, "r2")["state"] == "withdrawn"
    retry = device.edge("try", "r2", "--retry")
    assert retry.returncode == 0 and "r2 committed" in retry.stdout, retry.stdout + retry.stderr
    commit = [line for line in device.audit() if "commit: r2" in line][-1]
    assert "commit: r2 (1.5 s bake:" in commit and "committed before" not in commit
    assert device.serves("r2") and not os.path.exists(os.path.join(device.store, "rollout", "r2.json"))


def test_a_settle_restarts_a_daemon_that_serves_another_release_before_it_bakes(device):
    """Issue 43: an SSH drop between the switch and the restart left the daemon on r1 while `current` was r2; the
    settle baked r2 against r1's metrics and recorded a good release failed fleet-wide."""
    device.release("r1")
    assert device.edge("try", "r1").returncode == 0 and device.serves("r1")
    device.release("r2")
    trial = {"release": "r2", "fallback": "r1", "sha256": "", "armed_at": "2026-01-01T00:00:00Z",
             "by": "alice@ctl", "retry": False}
    with open(os.path.join(device.state, "trial.json"), "w", encoding="utf-8") as fh:
        json.dump(trial, fh)
    os.unlink(os.path.join(device.state, "current"))
    os.symlink("releases/r2", os.path.join(device.state, "current"))  # the switch; its restart never ran
    settle = device.edge("settle")
    assert settle.returncode == 0 and "committed r2" in settle.stdout, settle.stdout + settle.stderr
    assert any("restart: the service ran r1, current is r2" in line for line in device.audit())
    assert device.serves("r2") and not os.path.exists(os.path.join(device.store, "rollout", "r2.json"))


def test_a_settle_waits_for_the_restart_in_flight_before_it_judges_which_release_is_served(device):
    """The slow rollout story's race: a dropped connection killed `try` inside its restart, which freed the lock
    while the restart job still ran; the settle it had queued found the old daemon still answering for r1 and
    restarted the service a second time ("restart: the service ran r1, current is r2"). It waits for the job."""
    device.release("r1")
    assert device.edge("try", "r1").returncode == 0 and device.serves("r1")
    device.release("r2")
    restarts = len(device.lines("service.log"))
    with open(os.path.join(device.root, "hold-at"), "w", encoding="utf-8") as fh:
        fh.write("restart jetson-edge.service\n")
    argv, env = device.argv("try", "r2", "--no-wait")
    trying = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    assert sh.wait_until(lambda: os.path.exists(os.path.join(device.root, "held")), 90, 0.05)
    os.killpg(trying.pid, signal.SIGKILL)  # the drop: `try` and its systemctl client die, the restart job runs on
    trying.wait(timeout=30)

    def decided():  # restarted at once, or waiting on the job it saw
        return any("restart: the service ran" in line for line in device.audit()) or \
            "jetson-edge.service deactivating" in device.lines("show.log")

    assert sh.wait_until(decided, 90, 0.05) and device.serving() == "r1"  # the old daemon still answers
    os.unlink(os.path.join(device.root, "hold-at"))
    assert device.settled() and device.serves("r2")
    assert not any("restart: the service ran" in line for line in device.audit()), device.audit()
    assert device.lines("service.log")[restarts:] == ["restart r2"]
    assert "commit: r2 (1.5 s bake:" in device.audit()[-1]


@pytest.mark.parametrize("states, waited", [(["active"], 0.0), (["deactivating", "activating", "active"], 0.3),
                                            (["reloading", "inactive"], 0.1), (["deactivating"] * 50, 5.0)])
def test_the_wait_for_a_job_in_flight_is_a_policy_on_a_fake_clock(states, waited):
    """await_jobs reads the unit's ActiveState on the project's Backoff (0.1 s doubling) until no start, stop,
    restart or reload of it runs, and no longer than its limit (5 s here): then it returns what it last saw."""
    from edge.fleet.rollout import await_jobs, job_in_flight

    clock = [0.0]
    seen = iter(states)
    last = await_jobs(lambda: next(seen), limit_s=5.0, clock=lambda: clock[0],
                      sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    assert (last, round(clock[0], 6)) == (states[-1] if waited < 5 else "deactivating", waited)
    assert job_in_flight("activating", waited_s=4.9, limit_s=5.0)
    assert not job_in_flight("activating", waited_s=5.0, limit_s=5.0)
    assert not job_in_flight("failed", waited_s=0.0, limit_s=5.0)


def quiet_host(root, running):
    """A device root with r1 and r2 (both committed here), `running` current and committed, the other previous, and a
    stand-in systemctl that only notes its calls: nothing serves, so a bake fails at once and a settle returns to a
    release that passed here. Returns the state folder."""
    shutil.rmtree(root, ignore_errors=True)
    state = os.path.join(root, STATE)
    for name in ("r1", "r2"):
        folder = os.path.join(state, "releases", name)
        os.makedirs(os.path.join(folder, "models"))
        with open(os.path.join(folder, "models", "m.onnx"), "w", encoding="utf-8") as fh:
            fh.write(name)
        with open(os.path.join(folder, "config.yaml"), "w", encoding="utf-8") as fh:
            fh.write("service:\n  metrics:\n    enabled: true\n    host: 127.0.0.1\n    port: 9\n")
        with open(os.path.join(folder, "GATED"), "w", encoding="utf-8") as fh:
            json.dump({"release": name, "armed_at": "2026-01-01T00:00:00Z"}, fh)
    for link, release in (("current", running), ("committed", running), ("previous", {"r1": "r2"}.get(running, "r1"))):
        os.symlink("releases/" + release, os.path.join(state, link))
    with open(os.path.join(state, "rollout.json"), "w", encoding="utf-8") as fh:
        json.dump({"device": "dev-1", "keep": 0, "start_timeout_s": 0, "bake_s": 0}, fh)
    os.makedirs(os.path.join(root, "bin"))
    with open(os.path.join(root, "bin", "systemctl"), "w", encoding="utf-8") as fh:
        fh.write("#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/calls\"\n")
    os.chmod(os.path.join(root, "bin", "systemctl"), 0o755)
    return state


@pytest.mark.parametrize("move, running, argv", [("try", "r1", ["try", "r2", "--no-wait"]),
                                                 ("withdraw", "r2", ["withdraw", "r2", "--why", "camera faults"])])
def test_a_release_change_killed_at_any_moment_leaves_a_whole_release_the_next_settle_finishes(tmp_path, move,
                                                                                              running, argv):
    """SIGKILL right after each rename of `try` and `withdraw` (edge.store.versions.flip of current, previous and
    committed, and trial.json) and at seeded random steps: `current` always names a whole release, the switch line
    is in the audit before `current` names r2, and the next settle ends on r1 (r2's trial cannot pass: nothing
    serves; withdrawn: recorded first) or, withdraw killed before its record, still on r2, with no link a killed
    flip left behind."""
    root = str(tmp_path / "host")
    env = {"PATH": os.path.join(root, "bin") + os.pathsep + os.environ["PATH"]}
    args = ["release"] + argv + ["--state", os.path.join(root, STATE), "--by", "alice@ctl"]
    points = kill_points("release " + move, *args, env=env, prepare=lambda: quiet_host(root, running))
    assert len(points) >= 4
    for kind, k in points:
        state = quiet_host(root, running)
        killed(k, kind, *args, env=env)
        assert os.readlink(os.path.join(state, "current")) in ("releases/r1", "releases/r2"), (kind, k)
        audit = os.path.join(state, "audit.log")
        lines = open(audit, encoding="utf-8").read() if os.path.exists(audit) else ""
        assert move != "try" or os.readlink(os.path.join(state, "current")) == "releases/r1" or \
            "switch: r1 -> r2" in lines, (kind, k)
        recorded = os.path.exists(os.path.join(state, "refused", "r2.json"))
        settle = subprocess.run([sys.executable, "-m", "edge", "release", "settle", "--state", state, "--by", "t"],
                                capture_output=True, encoding="utf-8", timeout=120,
                                env=dict(os.environ, **env))
        assert settle.returncode == 0, (kind, k, settle.stderr)
        ends = "r2" if move == "withdraw" and not recorded else "r1"
        assert os.readlink(os.path.join(state, "current")) == "releases/" + ends, (kind, k, settle.stdout)
        assert not os.path.exists(os.path.join(state, "trial.json")), (kind, k)
        assert os.readlink(os.path.join(state, "committed")) != "releases/r2" or ends == "r2", (kind, k)
        assert [n for n in os.listdir(state) if n.startswith(".link-")] == [], (kind, k)


def test_the_release_sha256_covers_the_controllers_inputs_not_the_devices_config(tmp_path):
    """Issue 43: the sha256 covered each device's config.yaml and release.env (its camera, its metrics port, its
    paths), so one release had another sha256 on every device and "same content" could not be compared. Two
    devices with other configs agree; another model or another calibration image differs."""
    from edge.fleet.releases import Device

    here, there = (quiet_host(str(tmp_path / host), "r1") for host in ("here", "there"))
    r2 = os.path.join(there, "releases", "r2")
    with open(os.path.join(r2, "config.yaml"), "a", encoding="utf-8") as fh:
        fh.write("source:\n  uri: rtsp://cam-7.example/stream\n")
    with open(os.path.join(r2, "release.env"), "w", encoding="utf-8") as fh:
        fh.write("EDGE_RELEASE=r2\nEDGE_KERNEL_DIR=/srv/other-root/releases/r2/kernels\n")
    assert Device(here).digest("r2") == Device(there).digest("r2")
    os.makedirs(os.path.join(r2, "calibration", "default"))
    with open(os.path.join(r2, "calibration", "default", "0.jpg"), "wb") as fh:
        fh.write(b"an image")
    calibrated = Device(there).digest("r2")
    assert calibrated != Device(here).digest("r2")
    with open(os.path.join(r2, "models", "m.onnx"), "w", encoding="utf-8") as fh:
        fh.write("another model")
    assert Device(there).digest("r2") not in (calibrated, Device(here).digest("r2"))
