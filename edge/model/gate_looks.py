"""The looks each source model has had at each labelled regression set, so that rebuilding until a build passes
spends the set's error instead of reusing it.

A ledger per (source sha256, regression set sha256) lives beside the engines folder, outside it
(`<engines_dir>/../gate-looks/<source>-<set>.json`, folder 0700): deleting a gate report, a rollback or a new
artifact name does not reset it. Every judged look counts, whatever its verdict, --accept-inconclusive included;
look k is judged at edge.model.gate_stats.look_confidence(k), and after MAX_LOOKS the set is spent: a fresh labelled
set is required (its sha256 starts a new ledger).
"""

import os
import time
from typing import Any, Dict, List

from edge.errors import EXIT_FAIL, EdgeError
from edge.inputs import load_json
from edge.model.gate_stats import MAX_LOOKS
from edge.store.fileio import write_json_atomic

FOLDER = "gate-looks"


def ledger_path(engines_dir: str, source_sha256: str, set_sha256: str) -> str:
    parent = os.path.dirname(os.path.abspath(engines_dir))
    return os.path.join(parent, FOLDER, "{}-{}.json".format(source_sha256, set_sha256))


def looks_taken(path: str) -> List[Dict[str, Any]]:
    """The looks recorded at `path` (none when it does not exist); an unreadable ledger is an EdgeError, never a
    silent reset of the count."""
    if not os.path.lexists(path):
        return []
    data = load_json(path, "gate look ledger")
    looks = data.get("looks") if isinstance(data, dict) else None
    if not isinstance(looks, list) or not all(isinstance(look, dict) for look in looks):
        raise EdgeError("{}: gate look ledger must be a JSON object with a list 'looks'; it counts the looks at a "
                        "labelled set: use a fresh set rather than delete it".format(path))
    return looks


def next_look(path: str) -> int:
    """The number of the next look (1, 2, ...); an EdgeError (exit 1) once MAX_LOOKS are spent."""
    look = len(looks_taken(path)) + 1
    if look > MAX_LOOKS:
        raise EdgeError("accuracy gate refused: this model has had {} looks at this regression set, which spent its "
                        "95 % confidence; label a fresh set (build.regression_dir) to judge it again (ledger: {})"
                        .format(MAX_LOOKS, path), exit_code=EXIT_FAIL)
    return look


def record_look(path: str, entry: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Append `entry` (stamped with the time) to the ledger, written atomically; returns every look so far."""
    looks = looks_taken(path) + [dict(entry, at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))]
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    write_json_atomic(path, {"looks": looks}, "gate look ledger")
    return looks
