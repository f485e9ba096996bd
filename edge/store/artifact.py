"""A model on disk and everything beside it: read, verify, write, install and roll back. Every writer (export,
build install, the rebuild's candidate, rollback, cache fetch) and every reader (runtime load, classify, demo,
check, doctor, the build's source) goes through here.

An installed set is three files under one name:

    <stem><ext>         the artifact (an exported FP32 .onnx, a Q/DQ .onnx, a TensorRT .engine)
    <stem>.json         its model info: what it is and whether it is trained; `sha256` of the artifact's bytes,
                        `labels` and `labels_sha256` of the labels' bytes; for a built artifact also format,
                        precision, source, calibration, system, gate, build
    <stem>.labels.txt   one label per class

kept as one folder per set and switched in one step (edge.store.versions: the switch, the lock, the sweep;
edge.store.layout: the names, today's flat layout migrated); an export, which travels, stays three plain files
with its model info written last. Paths recorded in a model info are relative to its folder.

Readers: `read_set` reads the artifact's bytes once, checks them and the labels against the model info (a stale
or torn set is refused, one policy for every format) and hands them on; `verify` adds expected keys (a build's
inputs, an engine's board). Writers: `install` and `rollback`, each under `writing(folder)`, the folder's one lock.
"""

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from edge.board import current_system
from edge.errors import EdgeError
from edge.inputs import read_regular
from edge.store import layout as store
from edge.store import versions
from edge.store.fileio import check_folder, temp_name, write_json_atomic
from edge.store.model_info import UNTRAINED_WARNING as UNTRAINED_WARNING  # re-exported: readers import it here
from edge.store.model_info import in_set, info_path, model_info_at
from edge.store.model_info import read_model_info as read_model_info  # re-exported, as UNTRAINED_WARNING

MAX_ARTIFACT_BYTES = 2 << 30  # an engine of a large model is hundreds of MB; more is not an artifact
# What a TensorRT engine only runs on. Not the GPU name ("Orin" for 4 to 16 SMs) and not L4T: an L4T patch that
# keeps TensorRT and CUDA keeps engines valid (a changed L4T is a warning).
ENGINE_SYSTEM_KEYS = ("board", "sm_count", "compute_capability", "tensorrt", "cuda")
ENGINE_WARN_KEYS = ("l4t",)
MAX_LABELS_BYTES = 16 << 20
MAX_LABEL_CHARS = 256  # a class name; a longer "label" is not one (it would fill every log line and page)

Log = Callable[..., None]
Verify = Callable[[str], None]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def labels_file(model_path: str) -> str:
    return os.path.splitext(model_path)[0] + ".labels.txt"


def labels_path(model_path: str, configured: str = "") -> str:
    """The labels a model is served with: model.labels when set, else the ones of its set."""
    return configured or labels_file(model_path)


def companions(model_path: str) -> List[str]:
    """The set's files: labels, model info, the artifact."""
    return [labels_file(model_path), info_path(model_path), model_path]


def parse_labels(data: bytes, path: str) -> List[str]:
    """One label per line (UTF-8, a leading BOM dropped, any line ending). Labels reach logs, terminals and web
    pages: a blank line, a control character (an ANSI escape, NUL, a line separator) or a label over
    MAX_LABEL_CHARS is refused with its line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EdgeError("{}: labels file is not UTF-8 text (byte {})".format(path, exc.start)) from None
    text = text[1:] if text.startswith("\ufeff") else text
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    labels = text[:-1].split("\n") if text.endswith("\n") else text.split("\n") if text else []
    if not labels:
        raise EdgeError("{}: labels file must have one non-empty label per line".format(path))
    for number, label in enumerate(labels, 1):
        if not label.strip():
            raise EdgeError("{}: line {}: labels file must have one non-empty label per line".format(path, number))
        if not label.isprintable():
            raise EdgeError("{}: line {}: control or invisible characters in a label ({})".format(
                path, number, ascii(label)[:60]))
        if len(label) > MAX_LABEL_CHARS:
            raise EdgeError("{}: line {}: a label of {} characters; at most {}".format(
                path, number, len(label), MAX_LABEL_CHARS))
    return labels


def lookup(info: Dict[str, Any], dotted: str) -> Any:
    node: Any = info
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def engine_expectations(system: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The model-info keys an engine must match here: {'system.tensorrt': '10.3.0', ...}."""
    system = system or current_system()
    return {"system." + key: system[key] for key in ENGINE_SYSTEM_KEYS}


@dataclass(frozen=True)
class ModelSet:
    """An artifact read once and checked: its bytes, their sha256, its model info and its labels."""

    path: str  # as configured
    data: bytes
    sha256: str
    info: Dict[str, Any]
    labels: Optional[List[str]]  # None: no labels file
    labels_path: str
    notes: Tuple[str, ...] = ()  # what a reader should say (labels not covered by a sha256)

    @property
    def trained(self) -> bool:
        return self.info.get("trained") is True


def _read_bytes(path: str, *, shown: str, what: str, tail: str) -> Optional[bytes]:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a symlink loop on the way
        raise EdgeError("{}: cannot read the {}: {}{}".format(shown, what, exc.strerror, tail)) from None
    data, why = read_regular(path, MAX_ARTIFACT_BYTES)
    if data is None:
        raise EdgeError("{}: cannot read the {}: {}{}".format(shown, what, why, tail))
    return data


def read_set(model_path: str, *, labels: str = "", expected: Optional[Dict[str, Any]] = None,
             rebuild: str = "", required_info: bool = False) -> ModelSet:
    """`model_path`'s set, read once from one set folder and checked: the artifact's bytes against the sha256 its
    model info records, its labels (or model.labels, `labels`) against `labels_sha256`, and every dotted key of
    `expected` ('source.sha256', 'system.tensorrt', ...). Anything wrong: a one-line EdgeError with the reason
    and, when given, the command that rebuilds it."""
    tail = "; rebuild with: " + rebuild if rebuild else ""
    found = in_set(model_path)
    data = _read_bytes(found, shown=model_path, what="model", tail=tail)
    if data is None:
        raise EdgeError("{}: {}".format(model_path, "not built yet" + tail if rebuild else
                                        "model file not found (create it with: edge export)"))
    info = model_info_at(found, model_path, required_info)
    sha = sha256_bytes(data)
    if required_info and "sha256" not in info:
        raise EdgeError("{}: its model info records no sha256{}".format(model_path, tail))
    if info.get("sha256") not in (None, sha):  # one policy for a stale model info, every format
        raise EdgeError("{}: file differs from the sha256 in its model info {} (replaced by hand? re-export or "
                        "rebuild it{})".format(model_path, os.path.basename(info_path(model_path)),
                                               tail and ": " + rebuild))
    for key in sorted(expected or {}):
        if lookup(info, key) != (expected or {})[key]:
            raise EdgeError("{}: built for {} {!r}, expected {!r}{}".format(
                model_path, key, lookup(info, key), (expected or {})[key], tail))
    names, notes, chosen = None, [], labels or labels_file(found)
    text = _read_bytes(chosen, shown=labels or labels_file(model_path), what="labels", tail="")
    if text is not None:
        if len(text) > MAX_LABELS_BYTES:
            raise EdgeError("{}: labels file larger than {} MB".format(chosen, MAX_LABELS_BYTES >> 20))
        names = parse_labels(text, labels or labels_file(model_path))
    if not labels:
        notes += _check_labels(model_path, info, text)
    return ModelSet(model_path, data, sha, info, names, labels or labels_file(model_path), tuple(notes))


def _check_labels(model_path: str, info: Dict[str, Any], text: Optional[bytes]) -> List[str]:
    """The set's labels against the model info: the sha256 it records, or a note when it records none."""
    if "labels_sha256" not in info:
        return ["{}: labels not covered by a sha256 in its model info (installed by an older version); rebuild "
                "to cover them".format(model_path)] if "sha256" in info and text is not None else []
    have = None if text is None else sha256_bytes(text)
    if have != info["labels_sha256"]:
        why = ("its labels are not the ones its model info records" if text is not None else
               "its model info records labels, but they are missing")
        raise EdgeError("{}: {} (a torn or edited set); roll back or rebuild it".format(model_path, why))
    return []


def verify(model_path: str, expected: Optional[Dict[str, Any]] = None, *, rebuild: str = "edge build") -> \
        Dict[str, Any]:
    """The model info of an artifact this tool wrote, once its whole set checks (`read_set`, model info
    required); anything else is one line with the reason and the rebuild command."""
    return read_set(model_path, expected=expected, rebuild=rebuild, required_info=True).info


def is_current(model_path: str, expected: Dict[str, Any], *, rebuild: str = "edge build") -> Tuple[bool, str]:
    """(True, '') when `verify` accepts the artifact, else (False, reason)."""
    try:
        verify(model_path, expected, rebuild=rebuild)
    except EdgeError as exc:
        return False, str(exc)
    return True, ""


def check_engine(engine: Union[str, ModelSet], system: Optional[Dict[str, Any]] = None,
                 warn: Optional[Callable[[str], None]] = None, *, config_path: Optional[str] = None) -> Dict[str, Any]:
    """The TensorRT backend's load check of an engine (a path, or its set already read): it runs only on the board
    model, SM count, compute capability, TensorRT and CUDA it was built with (ENGINE_SYSTEM_KEYS). A changed L4T
    alone goes to `warn`. Returns its model info. The remedy names `config_path` (the config that serves it)."""
    system = system or current_system()
    model = read_set(engine, required_info=True) if isinstance(engine, str) else engine
    rebuild = "edge build --engine --config {}".format(config_path) if config_path else \
        "edge build --engine --model {}".format(lookup(model.info, "source.path") or "<fp32 .onnx>")
    if "sha256" not in model.info:
        raise EdgeError("{}: its model info records no sha256; rebuild with: {}".format(model.path, rebuild))
    for key, value in sorted(engine_expectations(system).items()):
        if lookup(model.info, key) != value:
            raise EdgeError("{}: built for {} {!r}, expected {!r}; rebuild with: {}".format(
                model.path, key, lookup(model.info, key), value, rebuild))
    for key in ENGINE_WARN_KEYS:
        if warn is not None and lookup(model.info, "system." + key) != system.get(key):
            warn("{}: engine built on {} {!r}, this board runs {!r}: kept (same TensorRT, CUDA and GPU)".format(
                model.path, key, lookup(model.info, "system." + key), system.get(key)))
    return model.info


def served_note(model_path: str, artifact: str) -> Optional[str]:
    """A line saying so when the config's model.path is not the file a build installs (<engines_dir>/<stem>.
    <precision><suffix>, edge.model.plan.artifact_path): the service would never serve what was built."""
    if os.path.abspath(model_path) == os.path.abspath(artifact):
        return None
    return ("note: model.path is {} but this build installs {}; a service with this config keeps running {} "
            "(set model.path: {})".format(model_path, artifact, model_path, artifact))


def make_model_info(artifact_path: str, source_info: Dict[str, Any], source_path: str, *, fmt: str, precision: str,
                    calibration: Optional[Dict[str, Any]], gate: Optional[Dict[str, Any]],
                    system: Dict[str, Any], build: Dict[str, Any]) -> Dict[str, Any]:
    """The model info of a built artifact: the source's info extended with what it was built from and on.
    `source.path` is relative to the artifact's folder: no absolute path is recorded. `install` names the file
    it installs and adds its labels' sha256."""
    info = dict(source_info)  # arch, weights, trained, input/output, preprocess ... from the FP32 model
    info.update({
        "artifact": os.path.basename(artifact_path),
        "format": fmt,
        "sha256": sha256_file(artifact_path),
        "precision": precision,
        "source": {"path": os.path.relpath(os.path.abspath(source_path),
                                           os.path.dirname(os.path.abspath(artifact_path))),
                   "sha256": sha256_file(source_path)},
        "calibration": calibration,
        "system": system,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gate": gate,
        "build": build,
    })
    return info


def staging_path(dest: str) -> str:
    """A fresh temporary name beside `dest` (same filesystem, so a set is linked, not copied), not yet created:
    the caller records it before anything writes it; a sweep removes it after a crash."""
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    return temp_name(folder, "." + os.path.basename(dest) + ".", ".staged")


def remove_quietly(paths: Sequence[Optional[str]]) -> None:
    for path in paths:
        if path and os.path.lexists(path) and not os.path.isdir(path):
            os.unlink(path)


@contextlib.contextmanager
def writing(folder: str, command: str) -> Iterator[None]:
    """The folder's one lock (versions.lock) held for a writer's whole run; taking it sweeps what a killed one left."""
    with versions.lock(folder, command):
        versions.sweep(folder)
        yield


def writable_set(dest: str, what: str) -> None:
    """Before any work: `dest`'s set can be installed (layout.check_names), in a folder this user can write."""
    store.check_names(dest, [os.path.basename(p) for p in companions(dest)], ("labels", "model info", "artifact"))
    check_folder(dest, what)


def _settle(dest: str) -> None:
    """Under the lock: today's flat layout migrated; what a killed writer left finished (links) or removed."""
    writable_set(dest, "artifact")
    store.settle(dest, [os.path.basename(p) for p in reversed(companions(dest))])


def install(dest: str, *, artifact: str, info: Dict[str, Any], labels: Optional[str] = None,
            verify_staged: Optional[Verify] = None, keep_previous: bool = True, files: bool = False,
            log: Log = print) -> Dict[str, Any]:
    """Install the file `artifact` as `dest`'s new set, with `labels` (a file) and `info` (completed with the
    sha256 of both, and `dest`'s name when it names one), after `verify_staged` accepts it; the set it replaces
    stays as previous (`keep_previous`). `files`: three plain files, the model info renamed last (an export: a
    crash between the renames leaves a set every reader refuses). Returns the model info installed."""
    if verify_staged is not None:
        verify_staged(artifact)
    label_bytes = None
    if labels is not None:
        label_bytes, why = read_regular(labels, MAX_LABELS_BYTES)
        if label_bytes is None:
            raise EdgeError("{}: cannot read the labels: {}".format(labels, why))
        parse_labels(label_bytes, labels)
    info = dict(info, sha256=sha256_file(artifact),
                labels=os.path.basename(labels_file(dest)) if labels is not None else None,
                labels_sha256=sha256_bytes(label_bytes) if label_bytes is not None else None)
    if "artifact" in info:  # a built artifact's info names it (a copy under another name is refused)
        info["artifact"] = os.path.basename(dest)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with versions.lock(os.path.dirname(os.path.abspath(dest)), "an install"):
        _settle(dest)
        had = store.current_set(dest) is not None and os.path.exists(dest) and not files
        info_tmp = staging_path(info_path(dest))
        try:
            write_json_atomic(info_tmp, info, "model info")
            named = {os.path.basename(dest): artifact, os.path.basename(info_path(dest)): info_tmp}
            if labels is not None:
                named[os.path.basename(labels_file(dest))] = labels
            if files:
                store.commit_files(dest, named, last=os.path.basename(info_path(dest)))
            else:
                store.commit(dest, named, keep_previous=keep_previous)
        finally:
            remove_quietly([info_tmp])
    kept = "; previous kept in {}/".format(store.PREVIOUS) if had and keep_previous else ""
    log("install: {} ({:.1f} MB){}".format(dest, os.path.getsize(dest) / 1e6, kept))
    return info


def withdraw(dest: str) -> None:
    """The undo of a first install: `dest`'s set removed (its artifact first)."""
    with versions.lock(os.path.dirname(os.path.abspath(dest)), "an undo"):
        store.remove(dest, [os.path.basename(p) for p in reversed(companions(dest))])


def rollback(dest: str, *, verify_kept: Optional[Verify] = None, log: Log = print) -> str:
    """Swap `dest`'s set with the previous one, after verifying that whole set as a build verifies what it
    installs (`read_set`, `verify_kept`); running it twice undoes it. Anything wrong: one line, nothing swapped."""
    folder = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(folder):
        raise EdgeError("{}: nothing to roll back to (no folder {})".format(dest, folder))
    with versions.lock(folder, "edge rollback"):
        _settle(dest)
        previous = store.previous_set(dest, store.current_set(dest))
        kept = store.set_file(dest, number=previous, name=os.path.basename(dest)) if previous else ""
        if not os.path.lexists(kept):
            raise EdgeError("{}: nothing to roll back to (no {})".format(
                dest, os.path.join(folder, store.PREVIOUS, os.path.basename(dest))))
        model = read_set(kept, rebuild="edge build (previous/ holds no usable artifact)", required_info=True)
        if verify_kept is not None:
            verify_kept(kept)
        for note in model.notes:
            log("rollback: " + note)
        store.swap_with_previous(dest)
    log("rollback: {} restored from {}/: {} (run rollback again to undo)".format(
        dest, store.PREVIOUS, describe_build(model.info)))
    return dest


def describe_build(info: Dict[str, Any]) -> str:
    """What a set's model info says of its build: precision, when, and the gate's verdict."""
    gate = info.get("gate") if isinstance(info.get("gate"), dict) else {}
    verdict = gate.get("verdict") or ("passed" if gate.get("passed") else "not gated" if not gate else "failed")
    return "{} built {}, gate {}{}".format(info.get("precision", "?"), info.get("built_at", "at an unknown date"),
                                          verdict, "" if gate.get("enforced", True) else " (not enforced)")

