"""The looks each source model has had at each labelled regression set, so that rebuilding until a build passes
spends the set's error instead of reusing it; and each source model's history across builds.

A ledger per (source sha256, regression set sha256) lives beside the engines folder, outside it
(`<engines_dir>/../gate-looks/<source>-<set>.json`, folder 0700): deleting a gate report, a rollback or a new
artifact name does not reset it. Every judged look counts, whatever its verdict, --accept-inconclusive included;
look k is judged at edge.model.gate_stats.look_confidence(k), and after MAX_LOOKS the set is spent: a fresh labelled
set is required (its sha256 starts a new ledger).

The history (`<engines_dir>/../gate-looks/<source>.history.jsonl`, one JSON object a line, rewritten whole with each
build): per build, the candidate, the set, the verdict, b and c (right to wrong, wrong to right), the drop, the
logit cosine, the per-class figures that changed and the strata; `edge gate history` and gate.md show the last few.
"""

import json
import os
import time
from typing import Any, Dict, List

from edge.errors import EXIT_FAIL, EdgeError
from edge.inputs import load_json, read_text
from edge.model.gate_stats import MAX_LOOKS
from edge.store.fileio import atomic_write, write_json_atomic

FOLDER = "gate-looks"
HISTORY_KEPT = 200  # builds a history file keeps (the oldest go first)
CLASSES_KEPT = 20  # per build, the classes whose right answers changed most
_FIGURES = ("look", "verdict", "regression_sha256", "samples", "labelled", "right_to_wrong", "wrong_to_right",
            "top1_drop_pp", "top1_drop_interval_pp", "reference_top1", "candidate_top1", "mean_cosine", "p5_cosine",
            "min_spread_ratio", "confidence")


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


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def record_look(path: str, entry: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Append `entry` (stamped with the time) to the ledger, written atomically; returns every look so far."""
    looks = looks_taken(path) + [dict(entry, at=_now())]
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_json_atomic(path, {"looks": looks}, "gate look ledger")
    return looks


def history_path(engines_dir: str, source_sha256: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(engines_dir)), FOLDER, source_sha256 + ".history.jsonl")


def read_history(path: str) -> List[Dict[str, Any]]:
    """Every build recorded at `path` (none when it does not exist); a line that is not a JSON object is an
    EdgeError naming the file and line."""
    if not os.path.lexists(path):
        return []
    out = []
    for number, line in enumerate(read_text(path, "the gate history", 64 << 20).splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not isinstance(entry, dict):
            raise EdgeError("{}:{}: the gate history's lines must be JSON objects".format(path, number))
        out.append(entry)
    return out


def history_entry(report: Dict[str, Any], candidate: str) -> Dict[str, Any]:
    """What a build adds to its source's history: the figures of its gate report `report`."""
    entry = {key: report[key] for key in _FIGURES if key in report}
    entry.update(at=_now(), candidate=candidate, collapsed=len(report.get("collapsed_classes") or []),
                 classes_changed=[c for c in report.get("per_class") or []  # worst first
                                  if c["candidate_right"] != c["reference_right"]][:CLASSES_KEPT],
                 strata=[{k: row.get(k) for k in ("stratum", "labelled", "right_to_wrong", "wrong_to_right",
                                                  "top1_drop_pp")} for row in report.get("strata") or []])
    return entry


def record_history(path: str, entry: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Append `entry` to the history at `path` (its last HISTORY_KEPT builds), written whole or not at all;
    returns the history."""
    history = (read_history(path) + [entry])[-HISTORY_KEPT:]
    data = "".join(json.dumps(e, sort_keys=True) + "\n" for e in history).encode("utf-8")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    atomic_write(path, lambda fh: fh.write(data), "gate history")
    return history
