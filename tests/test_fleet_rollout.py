"""The real deploy/ansible/site.yml against 10 local hosts and one offline one (tests/fleet/harness.py): each host
has its own root, a stand-in systemctl that logs starts and stops with the release `current` points at, and runs
this checkout's real `edge cache`, `edge build` and `edge check` (ONNX Runtime, a synthetic source).

One story, in order: a first rollout (one build for the fleet, the offline host reported and skipped), a re-run
that changes nothing, a failed gate, a failed build after it, a partial rollout and the kill switch."""

import os
import re
import shutil

import pytest
from fleet.harness import SITE, Fleet

from edge.build.calibration import import_calibration_set

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow  # several minutes of ansible-playbook on a loaded 2-core machine

HOSTS = 10
CANARY = "jetson-00"


def one_image_set(tmp, name, image):
    raw = tmp / ("raw-" + name)
    raw.mkdir()
    shutil.copy(os.path.join(REPO, "calibration", "default", image), str(raw))
    import_calibration_set(str(raw), str(tmp / name), 1, log=lambda *a: None)
    return str(tmp / name)


@pytest.fixture(scope="module")
def fleet(small_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    sets = tmp_path_factory.mktemp("sets")
    return Fleet(tmp, HOSTS, small_model, one_image_set(sets, "cal", "astronaut-00.jpg"),
                 one_image_set(sets, "reg", "astronaut-01.jpg"))


def recap(proc):
    return dict(re.findall(r"^(jetson-\S+)\s+: (ok=.*)$", proc.stdout, re.M))


def snapshot(fleet):
    return {h: (fleet.current(h), fleet.service_log(h), fleet.audit(h)) for h in fleet.hosts}


def test_rollout_failures_and_kill_switch(fleet):
    # 1. First rollout: every reachable device on r1; one build for the fleet; the offline device is skipped.
    first = fleet.play("r1", offline="jetson-offline")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert "SKIPPED (unreachable): jetson-offline" in first.stdout
    for host in fleet.hosts:
        assert fleet.current(host) == "r1"
        assert [line for line in fleet.service_log(host) if line != "daemon-reload"] == ["start r1"]
        assert re.search(r"Z alice@\S+ switch: nothing -> r1 \(rollout\)$", fleet.audit(host)[-1])
        with open(fleet.release_file(host, "r1", "release.env")) as fh:
            assert "EDGE_RELEASE=r1\n" in fh.read()  # what edge_build_info{release} reports on the device
    assert len(os.listdir(fleet.cache)) == 1  # one engine identity, published once
    built_at = {_built_at(fleet, h) for h in fleet.hosts}
    assert len(built_at) == 1  # every device runs the canary's build: nobody else built
    builders = [h for h in fleet.hosts if os.path.exists(fleet.release_file(
        h, "r1", "engines/mobilenet_v3_small.int8.gate.json"))]
    assert builders == [CANARY]

    # 2. A re-run with nothing changed: no stop, no restart, no gate.
    before = snapshot(fleet)
    gates = {h: os.path.getmtime(fleet.release_file(h, "r1", "latency-check.json")) for h in fleet.hosts}
    again = fleet.play("r1")
    assert again.returncode == 0, again.stdout[-4000:]
    assert snapshot(fleet) == before
    assert gates == {h: os.path.getmtime(fleet.release_file(h, "r1", "latency-check.json")) for h in fleet.hosts}
    assert all(" changed=0 " in line for line in recap(again).values()), recap(again)

    # 3. r2 fails its latency gate on the canary: back on r1, r2 marked failed, the rollout paused and stopped.
    before = snapshot(fleet)
    failed = fleet.play("r2", budget_ms=0.001)
    assert failed.returncode != 0
    assert fleet.current(CANARY) == "r1" and os.path.exists(fleet.release_file(CANARY, "r2", "FAILED"))
    assert fleet.service_log(CANARY)[-2:] == ["stop r1", "start r1"]
    assert "failed: r2 (Latency gate" in fleet.audit(CANARY)[-1] and "stays on r1" in fleet.audit(CANARY)[-1]
    with open(fleet.pause_file) as fh:
        assert "r2 failed on jetson-00" in fh.read()
    for host in fleet.hosts[1:]:
        assert fleet.current(host) == "r1" and fleet.service_log(host) == before[host][1]
        assert not os.path.exists(fleet.release_file(host, "r2", "GATED"))

    # 4. The operator resumes; r3's build fails: the device stays on r1, never on the failed r2, no restart.
    os.unlink(fleet.pause_file)
    log = fleet.service_log(CANARY)
    plain = os.path.join(fleet.base, "plain-images")  # images without a manifest: not a calibration set
    os.makedirs(plain)
    shutil.copy(os.path.join(REPO, "calibration", "default", "astronaut-02.jpg"), plain)
    broken = fleet.play("r3", engine_cache="", calibration_dir=plain)
    assert broken.returncode != 0
    assert fleet.current(CANARY) == "r1" and fleet.service_log(CANARY) == log
    assert "failed: r3 (Build" in fleet.audit(CANARY)[-1] and "stays on r1" in fleet.audit(CANARY)[-1]
    assert os.path.exists(fleet.release_file(CANARY, "r3", "FAILED"))

    # 5. A partial rollout of r4 (canary and wave 2), then the kill switch for r4 across the whole fleet.
    os.unlink(fleet.pause_file)
    wave = fleet.hosts[:4]
    partial = fleet.play("r4", "--limit", ",".join(wave), batches=[1, 3])
    assert partial.returncode == 0, partial.stdout[-4000:]
    assert [fleet.current(h) for h in fleet.hosts] == ["r4"] * 4 + ["r1"] * (HOSTS - 4)
    before = snapshot(fleet)
    cached = sorted(os.listdir(fleet.cache))
    gates = {h: os.path.getmtime(fleet.release_file(h, "r4", "latency-check.json")) for h in wave}
    kill = fleet.play("r4", action="rollback")
    assert kill.returncode == 0, kill.stdout[-4000:]
    assert [fleet.current(h) for h in fleet.hosts] == ["r1"] * HOSTS
    for host in wave:
        assert fleet.service_log(host)[len(before[host][1]):] == ["restart r1"]
        assert re.search(r"Z alice@\S+ rollback: r4 -> r1 \(kill switch\)$", fleet.audit(host)[-1])
        assert os.path.getmtime(fleet.release_file(host, "r4", "latency-check.json")) == gates[host]  # no gate
    assert sorted(os.listdir(fleet.cache)) == cached  # no build
    for host in fleet.hosts[4:]:
        assert snapshot(fleet)[host] == before[host]
    with open(fleet.pause_file) as fh:
        assert "rollback of r4 by alice" in fh.read()

    # 6. The rollout of r4 resumed by mistake while paused: nobody switches, the canary says why.
    stopped = fleet.play("r4")
    assert stopped.returncode != 0 and "rollout paused" in stopped.stdout
    assert [fleet.current(h) for h in fleet.hosts] == ["r1"] * HOSTS
    assert "paused: stays on r1, r4 not switched (rollback of r4 by alice)" in fleet.audit(CANARY)[-1]
    assert sorted(os.listdir(os.path.dirname(SITE))) == ["inventory.example.yml", "roles", "site.yml"]  # no litter


def _built_at(fleet, host):
    import json

    with open(fleet.release_file(host, "r1", "engines/mobilenet_v3_small.int8.json")) as fh:
        return json.load(fh)["built_at"]
