"""The real deploy/ansible/site.yml against three local hosts of two board types and one offline host
(tests/fleet/harness.py): the documented first install from a wheel, each host reached through a connection that
drops on demand, the real `edge run` serving each host's `current`, the real `edge cache`, `edge build` and
`edge release` (switch with the fallback armed, bake on the daemon's own metrics, commit or fall back by itself).

One story, in order: a first rollout (a canary per board type, one build, the rest fetch only, the offline host
skipped), a re-run that changes nothing, a release that fails its bake while its canary drops off the network in
the middle of the switch, that release refused from another checkout and installed with an explicit retry, a
canary dropping in the middle of a release that passes, the kill switch with one device offline (which leaves the
release when its timer fires), and the kill switch reaching a rollout in flight."""

import json
import os
import re
import shutil
import subprocess

import pytest
import service_helpers as sh
from fleet.harness import SITE, STATE, Fleet, build_wheel

from edge.model.calibration import import_calibration_set

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow  # ansible-playbook runs with live daemons: minutes on a loaded 2-core machine

BOARDS = ["orin", "orin", "xavier"]  # jetson-00 and jetson-02 are their types' canaries, jetson-01 follows
ORIN, FOLLOWER, XAVIER = "jetson-00", "jetson-01", "jetson-02"
RESTART = "restart jetson-edge.service"


def one_image_set(tmp, name, image):
    raw = tmp / ("raw-" + name)
    raw.mkdir()
    shutil.copy(os.path.join(REPO, "calibration", "default", image), str(raw))
    import_calibration_set(str(raw), str(tmp / name), 1, log=lambda *a: None)
    return str(tmp / name)


@pytest.fixture(scope="module")
def fleet(small_model, tmp_path_factory):
    sets = tmp_path_factory.mktemp("sets")
    wheel = build_wheel(tmp_path_factory.mktemp("dist"))
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), BOARDS, small_model, one_image_set(sets, "cal", "astronaut-00.jpg"),
                  one_image_set(sets, "reg", "astronaut-01.jpg"), wheel=wheel)
    yield fleet
    fleet.stop_services()


def recap(proc):
    return dict(re.findall(r"^(jetson-\S+)\s+: (ok=.*)$", proc.stdout, re.M))


def out(proc):
    return proc.stdout[-5000:] + proc.stderr[-2000:]


def serves(fleet, host, release, timeout=120):
    """The host's own daemon answers for `release` once its trial ended: old or new, never nothing."""
    return sh.wait_until(lambda: fleet.settled(host) and fleet.serving(host) == release, timeout, 0.2)


def record(fleet, release):
    path = os.path.join(fleet.cache, "rollout", release + ".json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def logs(fleet):
    return {h: fleet.service_log(h) for h in fleet.hosts}


def test_rollout_story(fleet, tmp_path):
    # 1. First install from the wheel: each board type's canary first, one build, the rest fetch; r1 everywhere.
    first = fleet.play("r1", offline="jetson-offline")
    assert first.returncode == 0, out(first)
    assert "SKIPPED (unreachable): jetson-offline" in first.stdout
    canaries = first.stdout.index("PLAY [Roll out to the canary of each board type]")
    rest = first.stdout.index("PLAY [Roll out to the rest of each board type (fetch only)]")
    assert re.findall(r"^changed: \[(jetson-\d+)\]", first.stdout[canaries:rest], re.M)[:1] == [ORIN]
    assert "[{}]".format(XAVIER) in first.stdout[canaries:rest] and "[{}]".format(FOLLOWER) not in \
        first.stdout[canaries:rest]
    for host in fleet.hosts:
        assert fleet.current(host) == "r1" and serves(fleet, host, "r1")
        assert fleet.service_log(host) == ["restart r1"]
        assert re.search(r"Z settle@\S+ commit: r1 \(2 s bake: \d+ frames, miss ratio 0\.0000, sha256 [0-9a-f]{12}\)$",
                         fleet.audit(host)[-1])
        venvs = os.listdir(os.path.join(fleet.root(host), "opt", "jetson-edge", "venvs"))
        assert len(venvs) == 1 and re.match(r"jetson_edge-0\.1\.0-py3-none-any-[0-9a-f]{12}$", venvs[0])
        # the safety net is enabled, and root's settle unit runs the committed release's venv under /opt
        assert all(os.path.exists(os.path.join(fleet.root(host), unit + ".enabled"))
                   for unit in ("jetson-edge.service", "jetson-edge-release.timer"))
        assert os.readlink(os.path.join(fleet.root(host), "opt", "jetson-edge", ".venv")) == os.path.join(
            fleet.root(host), "opt", "jetson-edge", "venvs", venvs[0])
    builders = [h for h in fleet.hosts if os.path.exists(fleet.release_file(h, "r1", "engines/mobilenet_v3_small"
                                                                             ".int8.gate.json"))]
    assert builders == [ORIN]  # the xavier canary found the same engine identity (ONNX Runtime: no board in it)
    # one engine entry beside the shared records and the release's bundle, which the followers fetch from here
    assert len([n for n in os.listdir(fleet.cache) if n not in ("rollout", "bundle")]) == 1
    assert len(os.listdir(os.path.join(fleet.cache, "bundle"))) == 1

    # 2. A re-run with nothing changed: no restart, nothing changed.
    before = logs(fleet)
    again = fleet.play("r1")
    assert again.returncode == 0, out(again)
    assert all(" changed=0 " in line for line in recap(again).values()), recap(again)
    assert logs(fleet) == before

    # 3. r2 misses its budget on every frame. The orin canary drops off the network as its service restarts on
    #    r2: the device bakes, fails and returns to r1 by itself, and records r2 failed in the shared store; the
    #    rollout stops there (a canary without a commit): nobody else switches.
    fleet.fault(ORIN, "drop-at", RESTART)
    failed = fleet.play("r2", budget_ms=0.001)
    assert failed.returncode != 0
    assert re.search(r"unreachable=1", recap(failed)[ORIN]), out(failed)
    assert serves(fleet, ORIN, "r1") and fleet.current(ORIN) == "r1"
    assert re.search(r"settle@\S+ failed: r2 \(2 s bake: \d+ frames, miss ratio 1\.0000 over 0\.05, sha256 \w+\), "
                     r"back on r1$", fleet.audit(ORIN)[-1])
    # the drop kills `try` inside its restart and frees the lock; the settle it queued waits for that restart to end
    # (the old daemon may still answer for r1 until then) and never restarts it a second time
    assert fleet.service_log(ORIN)[len(before[ORIN]):] == ["restart r2", "restart r1"]
    assert not any("restart: the service ran" in line for line in fleet.audit(ORIN))
    assert {h: fleet.service_log(h) for h in (FOLLOWER, XAVIER)} == {h: before[h] for h in (FOLLOWER, XAVIER)}
    assert record(fleet, "r2")["state"] == "failed"
    fleet.online(ORIN)

    # 4. Another checkout (no pause file of its own) with a passing budget: refused before any device is touched;
    #    then the explicit retry installs r2 everywhere and clears the fleet-wide record.
    if os.path.exists(fleet.pause_file):
        os.unlink(fleet.pause_file)
    before = logs(fleet)
    refused = fleet.play("r2")
    assert refused.returncode != 0 and "release r2 was failed" in refused.stdout and "jetson_edge_retry=r2" in \
        refused.stdout, out(refused)
    assert logs(fleet) == before
    retried = fleet.play("r2", retry="r2")
    assert retried.returncode == 0, out(retried)
    assert all(fleet.current(h) == "r2" and serves(fleet, h, "r2") for h in fleet.hosts)
    assert record(fleet, "r2") is None

    # 5. r3 passes; its orin canary drops off the network as its service restarts: it commits r3 by itself.
    fleet.fault(ORIN, "drop-at", RESTART)
    dropped = fleet.play("r3")
    assert dropped.returncode != 0
    assert serves(fleet, ORIN, "r3") and "commit: r3" in fleet.audit(ORIN)[-1]
    fleet.online(ORIN)
    assert fleet.play("r3").returncode == 0
    assert all(fleet.current(h) == "r3" and serves(fleet, h, "r3") for h in fleet.hosts)

    # 6. The kill switch for r3 while the follower is offline: the stop is recorded first, every reachable device
    #    goes back to r2; the offline one leaves r3 when its timer fires; no checkout installs r3 again.
    open(os.path.join(fleet.root(FOLLOWER), "OFFLINE"), "w", encoding="utf-8").close()
    kill = fleet.play("r3", action="rollback")
    assert kill.returncode == 0, out(kill)
    assert "SKIPPED (unreachable): {}".format(FOLLOWER) in kill.stdout
    assert record(fleet, "r3")["state"] == "withdrawn"
    for host in (ORIN, XAVIER):
        assert serves(fleet, host, "r2") and re.search(r"withdrawn: r3 \(kill switch by alice@\S+, sha256 \w+\), "
                                                       r"back on r2$", fleet.audit(host)[-1])
    assert fleet.current(FOLLOWER) == "r3"
    fleet.online(FOLLOWER)
    subprocess.run([os.path.join(fleet.root(FOLLOWER), "bin", "systemctl"), "start", "jetson-edge-release.service"],
                   check=True)  # its timer fires
    assert sh.wait_until(lambda: fleet.current(FOLLOWER) == "r2", 60, 0.2) and serves(fleet, FOLLOWER, "r2")
    os.unlink(fleet.pause_file)
    again = fleet.play("r3")
    assert again.returncode != 0 and "release r3 was withdrawn" in again.stdout
    assert all(fleet.current(h) == "r2" for h in fleet.hosts)

    # 7. The kill switch reaches a rollout in flight: r4's orin canary is held in the middle of its switch; the
    #    kill switch's record lands before it is released; the canary returns to r2, nobody else switches.
    fleet.fault(ORIN, "hold-at", RESTART)
    before = logs(fleet)
    rollout = fleet.start("r4")
    assert sh.wait_until(lambda: os.path.exists(os.path.join(fleet.root(ORIN), "held")), 600, 0.2)
    kill = fleet.start("r4", action="rollback")
    assert sh.wait_until(lambda: record(fleet, "r4") is not None, 120, 0.1)
    os.unlink(os.path.join(fleet.root(ORIN), "hold-at"))
    assert kill.wait(timeout=600) == 0 and rollout.wait(timeout=600) != 0
    for host in fleet.hosts:
        assert fleet.current(host) == "r2" and serves(fleet, host, "r2")
    assert [line for line in fleet.service_log(ORIN)[len(before[ORIN]):]] == ["restart r4", "restart r2"]
    assert logs(fleet)[FOLLOWER] == before[FOLLOWER] and logs(fleet)[XAVIER] == before[XAVIER]
    assert sorted(os.listdir(os.path.dirname(SITE))) == ["ansible.cfg", "inventory.example.yml", "roles",
                                                     "site.yml"]  # no litter
    assert all(not os.path.exists(os.path.join(fleet.root(h), STATE, "trial.json")) for h in fleet.hosts)
