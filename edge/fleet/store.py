"""Rollout state every controller and every device sees: a record per failed or withdrawn release, kept in the
shared engine cache (edge/model/engine_cache.py) beside the artifacts.

    <cache>/rollout/<release>.json   {"release", "state": "failed" | "withdrawn", "why", "sha256", "at", "by"}

A folder cache (an NFS mount) is read and written; an https:// cache serves the same folder and is read only
(the controller, or a device that mounts the folder, writes). Plain http:// is refused as for the artifacts: a
record that anything on the path can hide does not keep a withdrawn release out. A release with a record is
refused by every later run on any device, from any checkout, until an explicit retry commits it somewhere
(which clears the record).
"""

import os
from typing import Any, Dict, Optional

from edge.errors import EdgeError
from edge.inputs import load_json
from edge.model import engine_cache
from edge.store.fileio import temp_dir, write_json_atomic

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
        path = os.path.join(store, FOLDER, name)
        return load_record(path) if os.path.isfile(path) else None
    with temp_dir(_scratch(), ".rollout-") as tmp:
        dest = os.path.join(tmp, name)
        if not engine_cache.read_file(store, FOLDER, name, dest):  # its HTTP: https only, 404 = absent, one line
            return None
        return load_record(dest)


def load_record(path: str) -> Dict[str, Any]:
    """A record file (the store's or a device's refused/), checked: an object whose state is failed or withdrawn."""
    rec = load_json(path, "rollout record", MAX_RECORD_BYTES)
    if not isinstance(rec, dict) or rec.get("state") not in ("failed", "withdrawn"):
        raise EdgeError("{}: not a rollout record (an object with state failed or withdrawn)".format(path))
    return rec


def write(store: str, record: Dict[str, Any]) -> bool:
    """Add `record` to a folder store (True); an http(s):// store is read only here (False)."""
    if not store or is_url(store):
        return False
    if not os.path.isdir(store):
        raise EdgeError("{}: the shared engine cache folder does not exist".format(store))
    write_json_atomic(os.path.join(store, FOLDER, record["release"] + ".json"), record, "rollout record")
    return True


def clear(store: str, release: str) -> bool:
    """Remove the record of `release` from a folder store (an explicit retry committed it)."""
    if not store or is_url(store):
        return False
    try:
        os.unlink(os.path.join(store, FOLDER, release + ".json"))
    except FileNotFoundError:
        return False
    return True


def _scratch() -> str:
    return os.environ.get("TMPDIR") or "/tmp"
