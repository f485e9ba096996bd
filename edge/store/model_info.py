"""A model's model info (`<stem>.json` beside it, edge/store/artifact.py's set): where it is, how it is read, and
what it says about the weights' provenance.

A model without one is a user's own model: its provenance is stated neutrally ("yours (no model info)") and it is
treated as trained, as the build gates it. `expected_top1` (a fraction) is the source's known FP32 top-1, measured
on the labelled set whose sha256 is `expected_top1_set` (none: the user's own validation set): the gate refuses an
FP32 reference below it (edge.model.gate_checks). Export records it for bundled weights, `edge model add
--expected-top1` for a user's model, or else its first gated build records FP32's measured figure
(`record_measured_top1`, with the set's sha256 and `expected_top1_images`), so later builds are held to it.
Only a model info that says `trained: false` (edge's own seeded-random export, or a build declared --untrained)
makes every line carry UNTRAINED_WARNING. `edge model add` records a user's model info (labels, preprocessing,
provenance: edge/cli/model.py).
"""

import os
import re
from typing import Any, Dict, Optional

from edge.errors import EdgeError
from edge.inputs import load_json
from edge.store import layout, versions
from edge.store.fileio import write_json_atomic

UNTRAINED_WARNING = "UNTRAINED WEIGHTS: latency is real, labels are meaningless"
NO_INFO_WEIGHTS = "yours (no model info)"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def info_path(model_path: str) -> str:
    return os.path.splitext(model_path)[0] + ".json"


def in_set(model_path: str) -> str:
    """Where a reader finds `model_path`'s file: in the set folder its link names (resolved once), else as is."""
    folder, inside = layout.resolve(model_path)
    return os.path.join(folder, os.path.basename(model_path)) if inside else model_path


def read_model_info(model_path: str, *, required: bool = False) -> Dict[str, Any]:
    """The model info of `model_path`'s set. Absent: a user's own model (`NO_INFO_WEIGHTS`, trained), or an
    EdgeError when `required`. Present but not a JSON object with a boolean `trained` (and, when given, sha256s of
    64 hex digits and this file's name as `artifact`): an EdgeError naming the file."""
    return model_info_at(in_set(model_path), model_path, required)


def model_info_at(found: str, model_path: str, required: bool) -> Dict[str, Any]:
    """`read_model_info` of the file `found` (`model_path` resolved into its set)."""
    path = info_path(found)
    if not os.path.lexists(path):
        if required:
            raise EdgeError("{}: no model info {} beside it".format(model_path, os.path.basename(path)))
        return {"weights": NO_INFO_WEIGHTS, "trained": True}
    info = load_json(path, "model info")
    if not isinstance(info, dict) or not isinstance(info.get("trained"), bool):
        raise EdgeError("{}: model info must be a JSON object with a boolean 'trained'".format(path))
    expected = info.get("expected_top1")
    if expected is not None and not (isinstance(expected, (int, float)) and not isinstance(expected, bool)
                                     and 0 < expected <= 1):
        raise EdgeError("{}: model info 'expected_top1' must be a fraction in (0, 1], got {!r}".format(
            path, str(expected)[:40]))
    for key in ("sha256", "labels_sha256", "expected_top1_set"):
        if info.get(key) is not None and not (isinstance(info[key], str) and _SHA256.match(info[key])):
            raise EdgeError("{}: model info '{}' must be 64 hex digits".format(path, key))
    named = info.get("artifact", os.path.basename(model_path))
    if named != os.path.basename(model_path):
        raise EdgeError("{}: model info describes {!r}, not {} (renamed by hand? rebuild or rename it back)".format(
            path, str(named)[:80], os.path.basename(model_path)))
    return info


def record_measured_top1(model_path: str, top1: float, *, set_sha256: str, images: int) -> Optional[str]:
    """A user's model whose model info records no `expected_top1`: FP32's `top1` measured on `images` labelled images
    of the set `set_sha256` recorded as it, so that later builds are held to it; returns the model info's path, or
    None when there is no model info file or it records a figure already (or `top1` is 0)."""
    found = in_set(model_path)
    path = info_path(found)
    with versions.lock(os.path.dirname(os.path.abspath(path)), "recording the FP32 top-1"):
        if not os.path.lexists(path) or not 0 < top1 <= 1:
            return None
        info = model_info_at(found, model_path, True)
        if info.get("expected_top1") is not None:
            return None
        info.update(expected_top1=round(top1, 6), expected_top1_set=set_sha256, expected_top1_images=images,
                    expected_top1_from="FP32 measured by the first build")
        write_json_atomic(path, info, "model info")
    return path


def provenance(info: Dict[str, Any]) -> str:
    """What every header says about the weights: UNTRAINED_WARNING when the model info says so, else 'weights: ...'."""
    if info.get("trained") is False:
        return UNTRAINED_WARNING
    return "weights: {}".format(info.get("weights") or NO_INFO_WEIGHTS)
