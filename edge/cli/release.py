"""`edge release`: a device's releases, switched with a fallback armed first (edge/fleet/, docs/fleet.md).

    edge release try NAME [--retry]    arm the fallback, switch to NAME, restart; then wait for the bake's verdict:
                                       exit 0 committed, 1 failed (the device is back on the fallback) or no
                                       verdict within --timeout (the device decides by itself), 2 refused;
                                       --no-wait: exit 0 once armed and switched (the settle unit bakes)
    edge release settle                the settle unit and its timer: bake a release on trial and commit it or
                                       fall back; leave a release withdrawn or failed anywhere in the fleet
    edge release withdraw NAME         the kill switch on this device: NAME is refused from now on, and left
    edge release fail NAME --why W     record NAME failed (its build, the fleet gate): refused from now on, and left
    edge release check NAME [--retry]  exit 0 when NAME may be installed here, 2 (with the record) when refused
    edge release lease NAME --store S --run ID [--ttl T] [--steal] [--free]
                                       the controller's rollout lease in the shared store (edge/fleet/lease.py):
                                       taken or renewed by run ID, exit 1 naming the holder while another run's
                                       is unexpired; --steal takes it over, --free gives it back
    edge release status [NAME]         current, previous, committed, the trial and the refused releases (JSON);
                                       with NAME its verdict here: baking, committed, failed, withdrawn or none
                                       (what a play polls after `try --no-wait`), and the record's why

The state folder is /var/lib/jetson-edge-release (--state): root's alone (edge/fleet/statedir.py); its rollout.json
holds the settings deploy/ansible writes.
"""

import argparse
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from edge.cli.common import add_command
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError, one_line
from edge.fields import add_flags, leaves, options_from, setting

STATE = "/var/lib/jetson-edge-release"


def _who() -> str:
    return "{}@{}".format(os.environ.get("SUDO_USER") or os.environ.get("USER") or "root", socket.gethostname())


@dataclass(frozen=True)
class ReleaseOptions:
    """`edge release`'s flags, declared once (edge.fields)."""

    state: str = setting(STATE, "the state folder", flag="--state")
    by: str = setting("", "who, for the audit line and the records (empty: USER@host)", flag="--by")
    retry: bool = setting(False, "try or check a release that failed or was withdrawn", flag="--retry")
    no_wait: bool = setting(False, "try: return once armed and switched (the settle unit bakes; poll `edge release "
                            "status NAME`)", flag="--no-wait")
    timeout_s: float = setting(3600.0, "try: seconds to wait for the verdict", low=0, high=1e7, flag="--timeout")
    why: str = setting("kill switch", "withdraw, fail: the reason recorded", flag="--why")
    store: str = setting("", "lease: the shared store folder (deploy/ansible's jetson_edge_rollout_store)",
                         flag="--store")
    run: str = setting("", "lease: this run's id, the same for each renewal", flag="--run")
    ttl_s: float = setting(3600.0, "lease: seconds it holds without a renewal", low=60, high=86400, flag="--ttl")
    steal: bool = setting(False, "lease: take over another run's unexpired lease", flag="--steal")
    free: bool = setting(False, "lease: give it back (only the run holding it does)", flag="--free")


def cmd_lease(name: str, opts: ReleaseOptions) -> int:
    from edge.fleet import lease
    from edge.fleet.releases import check_name
    from edge.fleet.store import is_url

    check_name(name)
    if not opts.store.startswith("/") or is_url(opts.store) or not opts.run.strip():
        raise EdgeError("edge release lease: --store must be the store's absolute folder and --run an id")
    if opts.free:
        print("edge release: lease {}".format("freed" if lease.free(opts.store, run=opts.run) else "not held"))
        return EXIT_OK
    held = lease.take(opts.store, run=opts.run, release=name, operator=opts.by or _who(),
                      host=socket.gethostname(), now=time.time(), ttl_s=opts.ttl_s, steal=opts.steal)
    stole = "; taken over from " + held["stole"] if "stole" in held else ""
    print("edge release: lease on {} until {}{}".format(name, lease.at(held["expires"]), stole))
    return EXIT_OK


def cmd_try(dev: Any, name: str, opts: ReleaseOptions, by: str) -> int:
    from edge.fleet import rollout

    switch = rollout.try_release(dev, name, retry=opts.retry, by=by)
    print("edge release: {} {}".format(name, switch.outcome), flush=True)
    if switch.outcome == "current" or opts.no_wait:
        return EXIT_OK
    verdict = rollout.wait(dev, name, switch.armed_at, opts.timeout_s)
    if verdict is None:
        print("edge release: {} still baking after {:g} s; the device commits or falls back by itself".format(
            name, opts.timeout_s))
        return EXIT_FAIL
    rec = dev.refusal(name)
    print("edge release: {} {}".format(name, "committed" if verdict else "failed: {}, back on {}".format(
        one_line(str(rec.get("why", ""))) if rec else "", dev.link("current") or "nothing")))
    return EXIT_OK if verdict else EXIT_FAIL


def cmd_release(args: argparse.Namespace) -> int:
    from edge.fleet import rollout
    from edge.fleet.releases import Device

    opts = options_from(args, ReleaseOptions)
    if args.action == "lease":
        return cmd_lease(args.name, opts)
    dev = Device(opts.state)
    by = opts.by or _who()
    if args.action == "try":
        return cmd_try(dev, args.name, opts, by)
    if args.action == "settle":
        print("edge release: " + rollout.settle(dev, by))
        return EXIT_OK
    if args.action in ("withdraw", "fail"):
        move = rollout.withdraw if args.action == "withdraw" else rollout.fail
        print("edge release: " + move(dev, args.name, why=opts.why, by=by))
        return EXIT_OK
    if args.action == "check":
        print("edge release: {} may be installed ({})".format(args.name, rollout.check(dev, args.name, opts.retry)))
        return EXIT_OK
    status = {"current": dev.link("current"), "previous": dev.link("previous"), "committed": dev.link("committed"),
              "trial": dev.trial(), "refused": dev.refused_names()}
    if args.name:
        rec = dev.refusal(args.name) or {}
        status.update(release=args.name, verdict=rollout.verdict(dev, args.name), why=str(rec.get("why", "")))
    print(json.dumps(status, indent=2))
    return EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("try", "settle", "withdraw", "fail", "check", "status", "lease"))
    p.add_argument("name", nargs="?", default="",
                   help="the release (try, withdraw, fail, check, lease; status: its verdict)")
    add_flags(p, ReleaseOptions, *(dotted for dotted, _, _ in leaves(ReleaseOptions)))


def register(subparsers: Any) -> None:
    add_command(subparsers, "release", "switch a device's release with a fallback armed; bake, commit or fall back",
                __doc__, add_arguments, cmd_release)
