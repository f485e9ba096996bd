"""Rollout state every controller and every device sees: a record per failed or withdrawn release, kept in the
shared engine cache (edge/model/engine_cache.py) beside the artifacts.

    <cache>/rollout/<release>.json   {"release", "state": "failed" | "withdrawn", "why", "sha256", "at", "by"}

A folder cache (an NFS mount) is read and written; an https:// cache serves the same folder and is read only
(the controller, or a device that mounts the folder, writes). Plain http:// is refused as for the artifacts: a
record that anything on the path can hide does not keep a withdrawn release out. A release with a record is
refused by every later run on any device, from any checkout, until an explicit retry commits it somewhere
(which clears the record).

Root (the settle unit) reads and writes a folder store through edge/fleet/statedir.py: the path is walked without
following a link and each record is opened O_NOFOLLOW in its folder, so a link that a user who can write the
store (the service user publishes artifacts there) plants never takes root's write anywhere else.
"""

import contextlib
import os
from typing import Any, Dict, Iterator, Optional

from edge.errors import EdgeError
from edge.fleet.statedir import StateDir
from edge.model import engine_cache
from edge.store.fileio import temp_dir

FOLDER = "rollout"  # beside the 64-hex-digit key folders of the artifacts
MAX_RECORD_BYTES = 64 << 10


def is_url(store: str) -> bool:
    return "://" in store  # as edge/model/engine_cache.py reads a cache


def read(store: str, release: str) -> Optional[Dict[str, Any]]:
    """The store's record of `release`, or None. An unreadable store raises EdgeError: a caller that cannot know
    whether a release was withdrawn does not install it."""
    if not store:
        return None
    name = release + ".json"
    if not is_url(store):
        try:
            with StateDir.open(os.path.join(store, FOLDER), trusted=False) as folder:
                rec = folder.load_json(name, "rollout record", MAX_RECORD_BYTES)
        except FileNotFoundError:
            return None
        return None if rec is None else check_record(rec, os.path.join(store, FOLDER, name))
    with temp_dir(_scratch(), ".rollout-") as tmp:
        if not engine_cache.read_file(store, FOLDER, name, os.path.join(tmp, name)):  # https only, 404 = absent
            return None
        with StateDir.open(tmp, trusted=False) as folder:
            return check_record(folder.load_json(name, "rollout record", MAX_RECORD_BYTES), store + "/" + name)


def check_record(rec: Any, where: str) -> Dict[str, Any]:
    """A rollout record (a device's refused/ or the store's), checked: an object whose state is failed or
    withdrawn (its text is escaped wherever it is printed or logged)."""
    if not isinstance(rec, dict) or rec.get("state") not in ("failed", "withdrawn"):
        raise EdgeError("{}: not a rollout record (an object with state failed or withdrawn)".format(where))
    return rec


def write(store: str, record: Dict[str, Any]) -> bool:
    """Add `record` to a folder store (True); an http(s):// store is read only here (False)."""
    if not store or is_url(store):
        return False
    with records(store) as folder:
        folder.write_json(record["release"] + ".json", record)
    return True


@contextlib.contextmanager
def records(store: str) -> Iterator[StateDir]:
    """The rollout folder of the folder store `store`, made if missing (the store itself must exist)."""
    try:
        top = StateDir.open(store, trusted=False)
    except FileNotFoundError:
        raise EdgeError("{}: the shared engine cache folder does not exist".format(store)) from None
    with top:
        top.make_dir(FOLDER)
        with top.sub(FOLDER) as folder:
            yield folder


def clear(store: str, release: str) -> bool:
    """Remove the record of `release` from a folder store (an explicit retry committed it)."""
    if not store or is_url(store):
        return False
    try:
        with StateDir.open(os.path.join(store, FOLDER), trusted=False) as folder:
            if folder.lstat(release + ".json") is None:
                return False
            folder.unlink(release + ".json")
    except FileNotFoundError:
        return False
    return True


def _scratch() -> str:
    return os.environ.get("TMPDIR") or "/tmp"
