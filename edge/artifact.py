"""A model on disk and everything beside it: read, verify, write, install and roll back.

An artifact `<stem><ext>` (an exported FP32 .onnx, a Q/DQ .onnx, a TensorRT .engine) has beside it:

    <stem>.json         its model info: what it is and whether it is trained; for a built artifact also
                        sha256 (of its own bytes), format, precision, source, calibration, system, gate, build
    <stem>.labels.txt   one label per class

One reader (`read_model_info`, strict: a present but malformed file is a one-line EdgeError), one verifier
(`verify`: the sha256 of the bytes read, then the expected keys), one writer (`make_manifest` +
`write_json_atomic`). Paths recorded in a model info are basenames or relative to its folder.

Install and rollback: every file gets mode 0644; the new labels and model info are renamed into place first
and the artifact's rename commits the set, with SIGINT/SIGTERM/SIGHUP held back while the renames run, so a
signal never leaves a new artifact beside the old model info. `<folder>/previous/` keeps the set it replaced;
a symlink or folder where a file is expected is refused before anything is changed.
"""

import hashlib
import os
import re
import shutil
import stat
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from edge.board import ENGINE_WARN_KEYS, current_system, engine_expectations
from edge.errors import EdgeError
from edge.fileio import load_json, temp_name, write_json_atomic
from edge.interrupts import deferred

UNTRAINED_WARNING = "UNTRAINED WEIGHTS: latency is real, labels are meaningless"
PREVIOUS = "previous"
MODE = 0o644  # every file of an artifact: the service user reads what root built
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Log = Callable[..., None]
Verify = Callable[[str], None]


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def info_path(model_path: str) -> str:
    return os.path.splitext(model_path)[0] + ".json"


def labels_file(model_path: str) -> str:
    return os.path.splitext(model_path)[0] + ".labels.txt"


def labels_path(model_path: str, configured: str = "") -> str:
    """The labels a model is served with: model.labels when set, else the ones beside it."""
    return configured or labels_file(model_path)


def companions(model_path: str) -> List[str]:
    """The artifact's files; the artifact itself last (its rename commits an install)."""
    return [labels_file(model_path), info_path(model_path), model_path]


def read_model_info(model_path: str, required: bool = False) -> Dict[str, Any]:
    """The model info beside `model_path`. Absent: of unknown (so untrained) provenance, or an EdgeError when
    `required`. Present but not a JSON object with a boolean `trained` (and, when given, a sha256 of 64 hex
    digits and this file's name as `artifact`): an EdgeError naming the file."""
    path = info_path(model_path)
    if not os.path.lexists(path):
        if required:
            raise EdgeError("{}: no model info {} beside it".format(model_path, os.path.basename(path)))
        return {"weights": "unknown (no {})".format(os.path.basename(path)), "trained": False}
    info = load_json(path, "model info")
    if not isinstance(info, dict) or not isinstance(info.get("trained"), bool):
        raise EdgeError("{}: model info must be a JSON object with a boolean 'trained'".format(path))
    if "sha256" in info and not (isinstance(info["sha256"], str) and _SHA256.match(info["sha256"])):
        raise EdgeError("{}: model info 'sha256' must be 64 hex digits".format(path))
    named = info.get("artifact", os.path.basename(model_path))
    if named != os.path.basename(model_path):
        raise EdgeError("{}: model info describes {!r}, not {} (renamed by hand? rebuild or rename it back)".format(
            path, str(named)[:80], os.path.basename(model_path)))
    return info


def lookup(info: Dict[str, Any], dotted: str) -> Any:
    node: Any = info
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _regular(path: str, what: str) -> None:
    """Refuse a symlink, folder or device where a file of an artifact must be (absent is fine)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise EdgeError("{}: {} is {}; refusing to use it".format(path, what, kind))


def verify(model_path: str, expected: Optional[Dict[str, Any]] = None, rebuild: str = "edge build") -> Dict[str, Any]:
    """The artifact's model info, once its files are regular files, its bytes match the sha256 it records and
    every dotted key of `expected` ('source.sha256', 'system.tensorrt', ...) has the expected value. Anything
    else: a one-line EdgeError with the reason and the rebuild command."""
    tail = "; rebuild with: " + rebuild
    if not os.path.lexists(model_path):
        raise EdgeError("{}: not built yet{}".format(model_path, tail))
    for path, what in zip(companions(model_path), ("labels", "model info", "artifact")):
        _regular(path, what)
    info = read_model_info(model_path, required=True)
    if "sha256" not in info:
        raise EdgeError("{}: its model info records no sha256{}".format(model_path, tail))
    if sha256_file(model_path) != info["sha256"]:
        raise EdgeError("{}: file differs from the sha256 in its model info{}".format(model_path, tail))
    for key in sorted(expected or {}):
        have = lookup(info, key)
        if have != (expected or {})[key]:
            raise EdgeError("{}: built for {} {!r}, expected {!r}{}".format(model_path, key, have,
                                                                            (expected or {})[key], tail))
    return info


def is_current(model_path: str, expected: Dict[str, Any], rebuild: str = "edge build") -> Tuple[bool, str]:
    """(True, '') when `verify` accepts the artifact, else (False, reason)."""
    try:
        verify(model_path, expected, rebuild)
    except EdgeError as exc:
        return False, str(exc)
    return True, ""


def check_engine(engine_path: str, system: Optional[Dict[str, Any]] = None,
                 warn: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """The TensorRT backend's load check: an engine runs only on the board model, SM count, compute capability,
    TensorRT and CUDA it was built with (edge.board.engine_expectations). A changed L4T alone goes to `warn`."""
    system = system or current_system()
    source = "<fp32 .onnx>"
    if os.path.isfile(info_path(engine_path)):
        source = str(lookup(read_model_info(engine_path), "source.path") or source)
    info = verify(engine_path, engine_expectations(system), "edge build --engine --model {}".format(source))
    for key in ENGINE_WARN_KEYS:
        if warn is not None and lookup(info, "system." + key) != system.get(key):
            warn("{}: engine built on {} {!r}, this board runs {!r}: kept (same TensorRT, CUDA and GPU)".format(
                engine_path, key, lookup(info, "system." + key), system.get(key)))
    return info


def served_note(model_path: str, artifact: str) -> Optional[str]:
    """A line saying so when the config's model.path is not the file a build installs (<engines_dir>/<stem>.
    <precision><suffix>, edge.build.plan.artifact_path): the service would never serve what was built."""
    if os.path.abspath(model_path) == os.path.abspath(artifact):
        return None
    return ("note: model.path is {} but this build installs {}; a service with this config keeps running {} "
            "(set model.path: {})".format(model_path, artifact, model_path, artifact))


def make_manifest(artifact_path: str, source_info: Dict[str, Any], source_path: str, fmt: str, precision: str,
                  calibration: Optional[Dict[str, Any]], gate: Optional[Dict[str, Any]],
                  system: Dict[str, Any], build: Dict[str, Any]) -> Dict[str, Any]:
    """The model info of a built artifact: the source's info extended with what it was built from and on.
    `source.path` is relative to the artifact's folder: no absolute path is recorded."""
    manifest = dict(source_info)  # arch, weights, trained, input/output, labels ... from the FP32 model
    manifest.update({
        "artifact": os.path.basename(artifact_path),
        "format": fmt,
        "precision": precision,
        "sha256": sha256_file(artifact_path),
        "labels": os.path.basename(labels_file(artifact_path)),
        "source": {"path": os.path.relpath(os.path.abspath(source_path),
                                           os.path.dirname(os.path.abspath(artifact_path))),
                   "sha256": sha256_file(source_path)},
        "calibration": calibration,
        "system": system,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gate": gate,
        "build": build,
    })
    return manifest


def staging_path(dest: str) -> str:
    """A fresh temporary name beside `dest` (same filesystem, so the final rename is atomic), not yet created:
    the caller records it before anything writes it."""
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    return temp_name(folder, "." + os.path.basename(dest) + ".", ".staged")


def remove_quietly(paths: Sequence[Optional[str]]) -> None:
    for path in paths:
        if path and os.path.lexists(path) and not os.path.isdir(path):
            os.unlink(path)


def _copy_to_stage(src: str, dest: str, temps: List[str]) -> str:
    """A complete 0644 copy of `src` under a fresh name beside `dest`: a hard link when possible, else a copy."""
    tmp = staging_path(dest)
    temps.append(tmp)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.chmod(tmp, MODE)
    return tmp


def _backup_folder(dest: str) -> str:
    backup = os.path.join(os.path.dirname(os.path.abspath(dest)), PREVIOUS)
    if os.path.islink(backup) or (os.path.lexists(backup) and not os.path.isdir(backup)):
        raise EdgeError("{}: is not a folder (a symlink?); refusing to write through it (remove it)".format(backup))
    return backup


def install(staged: str, dest: str, manifest: Dict[str, Any], staged_labels: Optional[str] = None,
            verify_staged: Optional[Verify] = None, log: Log = print) -> str:
    """Verify `staged`, keep the current set in previous/, then put the new set in place (artifact last)."""
    if verify_staged is not None:
        verify_staged(staged)
    for path, what in zip(companions(dest), ("labels", "model info", "artifact")):
        _regular(path, what)
    backup = _backup_folder(dest)
    temps: List[str] = []
    try:
        manifest_tmp = staging_path(info_path(dest))
        temps.append(manifest_tmp)
        write_json_atomic(manifest_tmp, dict(manifest, artifact=os.path.basename(dest)))
        new = dict(zip(companions(dest), (staged_labels, manifest_tmp, staged)))
        kept: List[Tuple[Optional[str], str]] = []  # (a copy of the current file or None: none, previous/ name)
        if os.path.exists(dest):
            os.makedirs(backup, exist_ok=True)
            for path in companions(dest):
                final = os.path.join(backup, os.path.basename(path))
                _regular(final, "the kept copy")
                kept.append((_copy_to_stage(path, final, temps) if os.path.exists(path) else None, final))
        for tmp in new.values():
            if tmp is not None:
                os.chmod(tmp, MODE)
        with deferred():
            for tmp, final in kept:  # previous/ gets the current set complete
                if tmp is not None:
                    os.replace(tmp, final)
                elif os.path.lexists(final):
                    os.unlink(final)
            for final, tmp in new.items():
                if tmp is not None:
                    os.replace(tmp, final)
    finally:
        remove_quietly(temps)
    log("install: {} ({:.1f} MB){}".format(dest, os.path.getsize(dest) / 1e6,
                                           "; previous kept in {}/".format(PREVIOUS) if kept else ""))
    return dest


def rollback(dest: str, verify_kept: Optional[Verify] = None, log: Log = print) -> str:
    """Swap `dest` and its files with the set in previous/, after verifying that set as a build verifies what it
    installs; running it twice undoes it. Anything wrong: one line, nothing swapped."""
    backup = _backup_folder(dest)
    kept_artifact = os.path.join(backup, os.path.basename(dest))
    if not os.path.lexists(kept_artifact):
        raise EdgeError("{}: nothing to roll back to (no {})".format(dest, kept_artifact))
    verify(kept_artifact, None, "edge build (previous/ holds no usable artifact)")
    if verify_kept is not None:
        verify_kept(kept_artifact)
    for path, what in zip(companions(dest), ("labels", "model info", "artifact")):
        _regular(path, what)
    temps: List[str] = []
    try:
        moves: List[Tuple[str, str]] = []  # (from, to), applied in order
        for path in companions(dest):
            kept = os.path.join(backup, os.path.basename(path))
            if os.path.exists(kept):
                moves.append((_copy_to_stage(kept, path, temps), path))
            if os.path.exists(path):
                moves.append((_copy_to_stage(path, kept, temps), kept))
        with deferred():
            for src, final in moves:
                os.replace(src, final)
    finally:
        remove_quietly(temps)
    log("rollback: {} restored from {}/ (run rollback again to undo)".format(dest, PREVIOUS))
    return dest
