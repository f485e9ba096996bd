"""Built artifacts: their manifest, whether one is current, atomic install and rollback.

Beside every artifact sits `<artifact stem>.json` (edge.modelinfo.info_path): the source model's info
(`trained` included) extended with what the artifact was built from and on:

    sha256            the artifact's own bytes        source.sha256      the FP32 ONNX it came from
    format/precision  onnx-qdq | tensorrt-engine      calibration        set path, set sha256, method
    system            board model, SM count, compute capability, TensorRT, CUDA (what an engine is keyed on,
                      edge.board.ENGINE_SYSTEM_KEYS), GPU name, L4T release, ONNX Runtime, machine
    built_at, gate    build time, the accuracy-gate verdict and report

Install: the new file is verified where it was written (same folder, temporary name), the current artifact
and its manifest are linked (or copied) into `<engines>/previous/`, then renames put the new files in place.
A failure before the renames leaves the installed artifact untouched; `rollback()` swaps previous and current.
Checking a manifest against what is expected (and an engine against this board) is edge.board's.
"""

import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edge.board import check_manifest
from edge.errors import EXIT_FAIL, EdgeError, require
from edge.modelinfo import info_path, write_json_atomic

PREVIOUS = "previous"


def labels_file(artifact_path: str) -> str:
    return os.path.splitext(artifact_path)[0] + ".labels.txt"


def make_manifest(artifact_path: str, source_info: Dict[str, Any], source_path: str, fmt: str, precision: str,
                  calibration: Optional[Dict[str, Any]], gate: Optional[Dict[str, Any]],
                  system: Dict[str, Any], build: Dict[str, Any]) -> Dict[str, Any]:
    from edge.modelinfo import sha256_file

    manifest = dict(source_info)  # arch, weights, trained, input/output, labels ... from the FP32 model
    manifest.update({
        "artifact": os.path.basename(artifact_path),
        "format": fmt,
        "precision": precision,
        "sha256": sha256_file(artifact_path),
        "labels": os.path.basename(labels_file(artifact_path)),
        "source": {"path": os.path.abspath(source_path), "sha256": sha256_file(source_path)},
        "calibration": calibration,
        "system": system,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gate": gate,
        "build": build,
    })
    return manifest


def artifact_is_current(artifact_path: str, expected: Dict[str, Any], rebuild: str = "edge build") -> Tuple[bool, str]:
    """(True, '') when edge.board.check_manifest accepts the artifact, else (False, reason)."""
    try:
        check_manifest(artifact_path, expected, rebuild)
    except EdgeError as exc:
        return False, str(exc)
    return True, ""


def verify_onnx(path: str) -> None:
    """Parse, check and run one inference on zeros; a failure is an EdgeError naming the file."""
    onnx = require("onnx")
    ort = require("onnxruntime")
    try:
        onnx.checker.check_model(path)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        inp = session.get_inputs()[0]
        shape = [d if isinstance(d, int) else 1 for d in inp.shape]
        out = session.run(None, {inp.name: np.zeros(shape, np.float32)})[0]
    except Exception as exc:  # checker, protobuf and ORT raise their own types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgeError("{}: verification failed: {}".format(path, first), exit_code=EXIT_FAIL) from None
    if not np.all(np.isfinite(out)):
        raise EdgeError("{}: verification failed: non-finite output".format(path), exit_code=EXIT_FAIL)


def _link_or_copy(src: str, dst: str) -> None:
    """A complete copy of `src` at the new path `dst`: a hard link when possible (no space, instant), else a copy."""
    if os.path.lexists(dst):
        os.unlink(dst)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def staging_path(dest: str) -> str:
    """A temporary name beside `dest` (same filesystem, so the final rename is atomic)."""
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="." + os.path.basename(dest) + ".", suffix=".staged", dir=folder)
    os.close(fd)
    return path


def _companions(dest: str) -> List[str]:
    return [dest, info_path(dest), labels_file(dest)]


def install(staged: str, dest: str, manifest: Dict[str, Any], staged_labels: Optional[str] = None,
            verify: Optional[Callable[[str], None]] = None, log: Callable[..., None] = print) -> str:
    """Verify `staged`, back up the current artifact into previous/, then rename the new files into place."""
    if verify is not None:
        verify(staged)
    folder = os.path.dirname(os.path.abspath(dest))
    backup = os.path.join(folder, PREVIOUS)
    manifest_tmp = staging_path(info_path(dest))
    copies: List[Tuple[str, str]] = []  # (temporary, final) in previous/
    try:
        write_json_atomic(manifest_tmp, manifest)
        if os.path.exists(dest):  # previous/ gets the current set complete, or not at all
            os.makedirs(backup, exist_ok=True)
            for path in _companions(dest):
                if os.path.exists(path):
                    kept = os.path.join(backup, os.path.basename(path))
                    copies.append((staging_path(kept), kept))  # a fresh, exclusive name: no planted link
                    _link_or_copy(path, copies[-1][0])
            for path in _companions(dest):
                kept = os.path.join(backup, os.path.basename(path))
                if not os.path.exists(path) and os.path.exists(kept):
                    os.unlink(kept)
            for tmp, kept in copies:
                os.replace(tmp, kept)
        if staged_labels is not None:
            os.replace(staged_labels, labels_file(dest))
        os.chmod(staged, 0o644)
        os.replace(staged, dest)
        os.replace(manifest_tmp, info_path(dest))
    finally:
        for path in [manifest_tmp] + [tmp for tmp, _ in copies]:
            if os.path.exists(path):
                os.unlink(path)
    log("install: {} ({:.1f} MB){}".format(dest, os.path.getsize(dest) / 1e6,
                                           "; previous kept in {}/".format(PREVIOUS)
                                           if os.path.exists(os.path.join(folder, PREVIOUS, os.path.basename(dest)))
                                           else ""))
    return dest


def rollback(dest: str, log: Callable[..., None] = print) -> str:
    """Swap `dest` (and its manifest and labels) with the copy in previous/; running it twice undoes it."""
    folder = os.path.dirname(os.path.abspath(dest))
    backup = os.path.join(folder, PREVIOUS)
    if not os.path.isfile(os.path.join(backup, os.path.basename(dest))):
        raise EdgeError("{}: nothing to roll back to (no {})".format(
            dest, os.path.join(backup, os.path.basename(dest))))
    for path in _companions(dest):
        kept = os.path.join(backup, os.path.basename(path))
        if not os.path.exists(kept):
            continue
        swap = kept + ".swap"
        if os.path.exists(path):
            _link_or_copy(path, swap)  # the current file is never missing: it is replaced, not moved away
        os.replace(kept, path)
        if os.path.exists(swap):
            os.replace(swap, kept)
    log("rollback: {} restored from {}/ (run rollback again to undo)".format(dest, PREVIOUS))
    return dest


def remove_quietly(paths: Sequence[Optional[str]]) -> None:
    for path in paths:
        if path and os.path.exists(path):
            os.unlink(path)
