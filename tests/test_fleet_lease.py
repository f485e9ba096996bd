"""edge.fleet.lease: one rollout at a time (issue 43 MEDIUM 6: Bob's r3 ran beside Alice's r2). The policy on a
fake clock; the store's lease file under its lock; `edge release lease` refusing in one line naming the holder."""

import json
import os
import subprocess
import sys

import pytest

from edge.errors import EdgeError
from edge.fleet import lease

T0 = 1_800_000_000.0
ALICE = dict(run="a1", release="r2", operator="alice@ctl", host="ctl")
BOB = dict(run="b1", release="r3", operator="bob@ctl2", host="ctl2")


def test_an_unexpired_lease_refuses_another_run_and_names_its_holder():
    held = lease.decide(None, now=T0, ttl_s=600, steal=False, **ALICE)
    assert held["expires"] == T0 + 600 and held["taken"] == T0
    with pytest.raises(EdgeError) as err:
        lease.decide(held, now=T0 + 599, ttl_s=600, steal=False, **BOB)
    assert "rollout lease held by alice@ctl on ctl for r2 (run a1" in str(err.value)
    assert "in 1 s" in str(err.value) and "--steal" in str(err.value) and "\n" not in str(err.value)


def test_the_holder_renews_per_batch_and_keeps_it_past_the_first_expiry():
    held = lease.decide(None, now=T0, ttl_s=600, steal=False, **ALICE)
    renewed = lease.decide(held, now=T0 + 500, ttl_s=600, steal=False, **ALICE)
    assert renewed["taken"] == T0 and renewed["renewed"] == T0 + 500 and renewed["expires"] == T0 + 1100
    with pytest.raises(EdgeError):
        lease.decide(renewed, now=T0 + 700, ttl_s=600, steal=False, **BOB)  # past the first expiry: still held


def test_an_expired_lease_is_taken_and_a_steal_takes_an_unexpired_one_saying_from_whom():
    held = lease.decide(None, now=T0, ttl_s=600, steal=False, **ALICE)
    taken = lease.decide(held, now=T0 + 600, ttl_s=600, steal=False, **BOB)  # its controller died: expired
    assert taken["run"] == "b1" and taken["taken"] == T0 + 600 and "stole" not in taken
    stolen = lease.decide(held, now=T0 + 10, ttl_s=600, steal=True, **BOB)
    assert stolen["run"] == "b1" and stolen["stole"].startswith("alice@ctl on ctl for r2 (run a1")


def test_the_store_keeps_one_lease_and_only_its_run_frees_it(tmp_path):
    store = str(tmp_path)
    lease.take(store, now=T0, ttl_s=600, steal=False, **ALICE)
    with open(os.path.join(store, "rollout", "_lease.json"), encoding="utf-8") as fh:
        assert json.load(fh)["operator"] == "alice@ctl"
    with pytest.raises(EdgeError, match="held by alice@ctl"):
        lease.take(store, now=T0 + 1, ttl_s=600, steal=False, **BOB)
    assert not lease.free(store, run="b1")  # not Bob's to give back
    assert lease.free(store, run="a1") and not os.path.exists(os.path.join(store, "rollout", "_lease.json"))
    assert lease.take(store, now=T0 + 2, ttl_s=600, steal=False, **BOB)["run"] == "b1"


def test_a_lease_file_that_is_not_one_is_refused_in_one_line(tmp_path):
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout" / "_lease.json").write_text('{"run": "a1", "expires": "soon"}', encoding="utf-8")
    with pytest.raises(EdgeError, match=r"_lease.json: not a rollout lease"):
        lease.take(str(tmp_path), now=T0, ttl_s=600, steal=False, **BOB)


def test_edge_release_lease_refuses_a_second_run_with_exit_1_and_one_line(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "edge", "release", "lease"] + list(args) +
                              ["--store", str(tmp_path)], capture_output=True, encoding="utf-8", timeout=120)

    first = run("r2", "--run", "a1", "--by", "alice@ctl")
    assert first.returncode == 0 and "lease on r2 until" in first.stdout, first.stderr
    second = run("r3", "--run", "b1", "--by", "bob@ctl2")
    assert second.returncode == 1 and len(second.stderr.strip().splitlines()) == 1
    assert "rollout lease held by alice@ctl on" in second.stderr
    stolen = run("r3", "--run", "b1", "--by", "bob@ctl2", "--steal")
    assert stolen.returncode == 0 and "taken over from alice@ctl" in stolen.stdout
    assert run("r3", "--run", "b1", "--free").stdout.strip() == "edge release: lease freed"
    assert run("r3", "--run", "b1", "--ttl", "5").returncode == 2  # bounds from its declaration
