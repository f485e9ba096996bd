"""One rollout at a time: a lease in the shared store (edge/fleet/store.py), taken on the controller before any
device is touched, renewed per batch, freed at the end. While another run holds an unexpired lease, a run is
refused in one line naming the holder; `steal` takes it over explicitly (the holder's controller died).

    <store>/rollout/_lease.json   {"release", "operator", "host", "run", "taken", "renewed", "expires"[, "stole"]}

Times are seconds since the epoch; `decide` is the policy (no clock: the caller passes `now`). A release name
never starts with "_", so the lease never takes a release's record's name.
"""

import contextlib
import datetime
import fcntl
import os
from typing import Any, Dict, Iterator, Optional, Tuple

from edge.errors import EXIT_FAIL, EdgeError, one_line
from edge.fleet import store
from edge.fleet.statedir import StateDir

LEASE = "_lease.json"
LOCK = "_lease.lock"
MAX_LEASE_BYTES = 16 << 10


def at(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def holder(held: Dict[str, Any], now: float) -> str:
    """Who holds the lease, for one line (its text may come from anywhere: escaped)."""
    return "{} on {} for {} (run {}, expires {}, in {:.0f} s)".format(
        one_line(str(held.get("operator", "?")), 80), one_line(str(held.get("host", "?")), 80),
        one_line(str(held.get("release", "?")), 80), one_line(str(held.get("run", "?")), 80),
        at(held["expires"]), max(0.0, held["expires"] - now))


def held_by_other(held: Optional[Dict[str, Any]], run: str, now: float) -> bool:
    return held is not None and held.get("run") != run and held["expires"] > now


def decide(held: Optional[Dict[str, Any]], *, run: str, release: str, operator: str, host: str, now: float,
           ttl_s: float, steal: bool) -> Dict[str, Any]:
    """The lease `run` holds from `now` for `ttl_s`: taken (none, or expired), renewed (its own) or stolen
    (`steal`); EdgeError naming the holder while another run's lease is unexpired and `steal` is not given."""
    other = held_by_other(held, run, now)
    if other and not steal:
        raise EdgeError("rollout lease held by {}; wait for it, or take it over with --steal (deploy/ansible: -e "
                        "jetson_edge_lease_steal=true)".format(holder(held, now)), EXIT_FAIL)  # type: ignore[arg-type]
    own = held is not None and held.get("run") == run
    lease = {"release": release, "operator": operator, "host": host, "run": run,
             "taken": held["taken"] if own and held else now, "renewed": now, "expires": now + ttl_s}
    if other and held:
        lease["stole"] = holder(held, now)
    return lease


def check_lease(held: Any, where: str) -> Dict[str, Any]:
    """A lease read from the store: an object naming its run, with numeric times."""
    if not isinstance(held, dict) or not isinstance(held.get("run"), str) or any(
            isinstance(held.get(k), bool) or not isinstance(held.get(k), (int, float)) for k in ("taken", "expires")):
        raise EdgeError("{}: not a rollout lease (an object with run, taken and expires)".format(where))
    return held


@contextlib.contextmanager
def _locked(store_path: str) -> Iterator[Tuple[StateDir, Optional[Dict[str, Any]]]]:
    """The store's rollout folder and the lease in it, under one lock: another controller between this read and
    this write waits."""
    with store.records(store_path) as folder:
        fd = folder.open_file(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = folder.load_json(LEASE, "rollout lease", MAX_LEASE_BYTES)
            yield folder, None if held is None else check_lease(held, folder.where(LEASE))
        finally:
            os.close(fd)


def take(store_path: str, *, run: str, release: str, operator: str, host: str, now: float, ttl_s: float,
         steal: bool) -> Dict[str, Any]:
    """Take or renew the lease in the folder store `store_path`."""
    with _locked(store_path) as (folder, held):
        lease = decide(held, run=run, release=release, operator=operator, host=host, now=now, ttl_s=ttl_s,
                       steal=steal)
        folder.write_json(LEASE, lease)
    return lease


def free(store_path: str, *, run: str) -> bool:
    """Remove the lease if `run` holds it (True); another run's lease stays."""
    with _locked(store_path) as (folder, held):
        if held is None or held.get("run") != run:
            return False
        folder.unlink(LEASE)
    return True
