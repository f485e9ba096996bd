"""The JSON sidecar written beside every model artifact (`<model>.json`): what it is and whether it is trained.

The runtime reads it without torch: every report and log line says so when the weights are not trained.
"""

import hashlib
import json
import os
from typing import Any, Dict

from edge.errors import EdgeError
from edge.fileio import atomic_write, load_json

UNTRAINED_WARNING = "UNTRAINED WEIGHTS: latency is real, labels are meaningless"


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def info_path(model_path: str) -> str:
    return os.path.splitext(model_path)[0] + ".json"


def read_model_info(model_path: str) -> Dict[str, Any]:
    """The sidecar's contents; a model without one is treated as of unknown (so untrained) provenance."""
    path = info_path(model_path)
    if not os.path.isfile(path):
        return {"weights": "unknown (no {})".format(os.path.basename(path)), "trained": False}
    info = load_json(path, "model info")
    if not isinstance(info, dict) or not isinstance(info.get("trained"), bool):
        raise EdgeError("{}: model info must be a JSON object with a boolean 'trained'".format(path))
    return info


def write_json_atomic(path: str, data: Dict[str, Any], what: str = "JSON file") -> None:
    """Sorted, indented JSON, written whole or not at all (edge.fileio.atomic_write)."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")), what)
