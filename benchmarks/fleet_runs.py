#!/usr/bin/env python3
"""A no-op run, the kill switch and a rollout of deploy/ansible/site.yml on the fleet harness with many hosts.

    python benchmarks/fleet_runs.py [--hosts 50] [--forks 50 5] [--measure runs rollout]
                                    [--rollout-forks 5] [--bake-s 20] [--model M.onnx] [--keep DIR]

One harness host gets two releases the real way (r1, then r2: build, switch, bake on its live daemon, commit);
its root is then copied to the other hosts (paths rewritten). Then, per --forks value, side by side:
`site.yml -e jetson_edge_release=r2` with nothing to change (every device `changed=0`) and the kill switch for r2
(every device back on r1), wall time each. Then a rollout of a new release to every host (a canary, batches of
10 % and 100 %), with --rollout-forks forks and a --bake-s bake, twice:
- before: `edge release try` holds its fork for the whole bake (the follower play host_pinned). This is
  deploy/ansible as it is, copied, with the commit that brought `try --no-wait` (found by `git log -S`) reversed
  in the copy: its gate.yml hunks, and the follower play's strategy back to host_pinned; nothing else differs.
- after: deploy/ansible as it is (`try --no-wait`, the play polls `edge release status`, linear).
docs/fleet.md has the tables.

What is real and what stands in: the playbook, the controller's work, every module run on each host, `edge
release try` / `status` / `settle` (the switch, the settle unit's real bake and commit) are real. After the copy, no
host runs `edge run`: the stand-in systemctl (tests/fleet/systemctl, a host with <root>/healthy) starts, in place
of the daemon, a tiny HTTP server whose /metrics says what a healthy daemon of `current` would (its release, its
start time, 20 frames a second, no miss), so the bake reads a daemon that always passes. The hosts are folders on
this machine, reached without SSH (the harness connection plugin), and share its cores with the controller.
"""


import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "tests"))

from fleet.harness import SITE, STATE, Fleet  # noqa: E402

from edge.model.calibration import import_calibration_set  # noqa: E402
from edge.model.export import export_model  # noqa: E402


def one_image_set(base, name, image):
    raw = os.path.join(base, "raw-" + name)
    os.makedirs(raw)
    shutil.copy(os.path.join(HERE, "calibration", "default", image), raw)
    import_calibration_set(raw, os.path.join(base, name), 1, log=lambda *a: None)
    return os.path.join(base, name)


def clone(fleet, source, host):
    """`host` becomes a copy of `source` (a device on r2 with r1 before it), its root paths rewritten."""
    src, dst = fleet.root(source), fleet.root(host)
    shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)
    for name in ("live", "daemon.pid", "service.log"):
        if os.path.exists(os.path.join(dst, name)):
            os.unlink(os.path.join(dst, name))
    open(os.path.join(dst, "healthy"), "w", encoding="utf-8").close()  # a stand-in daemon that passes its bake
    with open(os.path.join(dst, "service.state"), "w", encoding="utf-8") as fh:
        fh.write("active\n")
    old, new = src.encode(), dst.encode()
    for parent, _, files in os.walk(dst):
        for name in files:
            path = os.path.join(parent, name)
            if os.path.islink(path):
                target = os.readlink(path)
                if target.startswith(src):
                    os.unlink(path)
                    os.symlink(dst + target[len(src):], path)
            elif os.path.getsize(path) < (1 << 20) and not name.endswith((".onnx", ".jpg", ".whl")):
                with open(path, "rb") as fh:
                    data = fh.read()
                if name == "config.yaml":  # each device's own metrics port
                    data = data.replace(b"port: %d" % fleet.ports[source], b"port: %d" % fleet.ports[host])
                with open(path, "wb") as fh:
                    fh.write(data.replace(old, new).replace(source.encode(), host.encode()))
    for rel in ("releases/r1/venv", "releases/r2/venv"):
        link = os.path.join(dst, STATE, rel)
        if os.path.islink(link) and os.readlink(link).startswith(src):
            target = os.readlink(link)
            os.unlink(link)
            os.symlink(dst + target[len(src):], link)


def before_no_wait(base):
    """The playbook before `try --no-wait`: a copy of deploy/ansible with the commit that brought it reversed
    (gate.yml: `try` waits for its verdict; site.yml: the follower play host_pinned), in a folder that links the
    rest of the checkout. Returns its site.yml."""
    gate = "deploy/ansible/roles/jetson_edge/tasks/gate.yml"
    commits = subprocess.run(["git", "log", "--reverse", "--format=%H", "-S'--no-wait'", "--", gate], cwd=HERE,
                             capture_output=True, encoding="utf-8", check=True).stdout.split()
    if not commits:
        raise SystemExit("no commit of {} brings '--no-wait' (a checkout without its history?)".format(gate))
    copy = os.path.join(base, "before")
    shutil.copytree(os.path.join(HERE, "deploy", "ansible"), os.path.join(copy, "deploy", "ansible"))
    for parent, skip in (("", "deploy"), ("deploy", "ansible")):  # what the play reads beside it: systemd/, edge/ ...
        for name in os.listdir(os.path.join(HERE, parent)):
            if name != skip and not name.startswith("."):
                os.symlink(os.path.join(HERE, parent, name), os.path.join(copy, parent, name))
    diff = subprocess.run(["git", "show", "--format=", commits[0], "--", gate], cwd=HERE, capture_output=True,
                          check=True).stdout
    subprocess.run(["patch", "-R", "-p1", "-s", "-d", copy], input=diff, check=True)
    site = os.path.join(copy, "deploy", "ansible", "site.yml")
    with open(site, encoding="utf-8") as fh:
        text = fh.read()
    follower = "  strategy: linear\n  serial:"
    if text.count(follower) != 1:
        raise SystemExit("{}: the follower play's `strategy: linear` not found once".format(site))
    with open(site, "w", encoding="utf-8") as fh:
        fh.write(text.replace(follower, "  strategy: host_pinned\n  serial:"))
    return site


def timed(fleet, release, forks, **extra):
    start = time.monotonic()
    proc = fleet.play(release, forks=forks, timeout=4 * 3600, **extra)
    wall = time.monotonic() - start
    recap = dict(re.findall(r"^(jetson-\S+)\s+: (ok=.*)$", proc.stdout, re.M))
    if proc.returncode != 0:
        raise SystemExit("{} failed:\n{}".format(release, proc.stdout[-4000:]))
    return wall, recap


def noop_and_kill(fleet, forks_list, hosts):
    print("| forks | no-op run (s) | changed | kill switch (s) | back on r1 |")
    print("|---|---|---|---|---|")
    for forks in forks_list:
        noop, recap = timed(fleet, "r2", forks)
        unchanged = sum(" changed=0 " in line for line in recap.values())
        kill, _ = timed(fleet, "r2", forks, action="rollback")
        back = sum(fleet.current(h) == "r1" for h in fleet.hosts)
        print("| {} | {:.0f} | {} of {} hosts changed=0 | {:.0f} | {} of {} |".format(
            forks, noop, unchanged, hosts, kill, back, hosts), flush=True)
        for host in fleet.hosts:  # on r2 again for the next round, as a redeploy would leave them
            state = os.path.join(fleet.root(host), STATE)
            for name, target in (("current", "r2"), ("previous", "r1")):
                if os.path.lexists(os.path.join(state, name)):
                    os.unlink(os.path.join(state, name))
                os.symlink("releases/" + target, os.path.join(state, name))
            os.unlink(os.path.join(state, "refused", "r2.json"))
        os.unlink(os.path.join(fleet.cache, "rollout", "r2.json"))
        os.unlink(fleet.pause_file)


def rollouts(fleet, base, forks, bake_s):
    """The rollout of a new release to every host, before and after `try --no-wait`, one after the other."""
    sites = (("before (try waits, host_pinned)", before_no_wait(base)), ("after (try --no-wait, linear)", SITE))
    print("| play | rollout (s) | committed |")
    print("|---|---|---|")
    for number, (label, site) in enumerate(sites, 3):
        release = "r{}".format(number)
        wall, _ = timed(fleet, release, forks, site=site, bake_s=bake_s, bake_interval_s=5)
        committed = sum(fleet.current(h) == release and os.path.exists(fleet.release_file(h, release, "GATED"))
                        for h in fleet.hosts)
        print("| {} | {:.0f} | {} of {} |".format(label, wall, committed, len(fleet.hosts)), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--forks", type=int, nargs="+", default=[50, 5], help="the no-op run's and kill switch's")
    parser.add_argument("--measure", nargs="+", choices=["runs", "rollout"], default=["runs", "rollout"],
                        help="runs: the no-op run and the kill switch per --forks; rollout: before and after")
    parser.add_argument("--rollout-forks", type=int, default=5)
    parser.add_argument("--bake-s", type=float, default=20.0, help="the rollout's jetson_edge_bake_s")
    parser.add_argument("--model", help="an FP32 ONNX classifier (default: a MobileNetV3-Small exported here)")
    parser.add_argument("--keep", help="leave the harness in this folder")
    args = parser.parse_args()
    base = args.keep or tempfile.mkdtemp(prefix="fleet-bench-")
    model = args.model
    if not model:
        model = os.path.join(base, "mobilenet_v3_small.onnx")
        export_model("mobilenet_v3_small", "random", model, log=lambda *a: None)
    fleet = Fleet(os.path.join(base, "fleet"), ["orin"] * args.hosts, model,
                  one_image_set(base, "cal", "astronaut-00.jpg"), one_image_set(base, "reg", "astronaut-01.jpg"))
    first = fleet.hosts[0]
    try:
        for release in ("r1", "r2"):  # the real way, on one host
            proc = fleet.play(release, "--limit", first)
            if proc.returncode != 0:
                raise SystemExit(proc.stdout[-4000:])
        fleet.stop_services()
        for host in fleet.hosts[1:]:
            clone(fleet, first, host)
        os.unlink(os.path.join(fleet.root(first), "live"))  # state only, as its copies
        open(os.path.join(fleet.root(first), "healthy"), "w", encoding="utf-8").close()
        with open(os.path.join(fleet.root(first), "service.state"), "w", encoding="utf-8") as fh:
            fh.write("active\n")
        print("{} hosts, this machine: {} cores, load {:.1f}".format(args.hosts, os.cpu_count(), os.getloadavg()[0]))
        if "runs" in args.measure:
            noop_and_kill(fleet, args.forks, args.hosts)
        if "rollout" in args.measure:
            rollouts(fleet, base, args.rollout_forks, args.bake_s)
    finally:
        fleet.stop_services()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
