"""A built model on disk (edge.store.artifact): one strict reader, verification of the bytes and the labels against the
model info, install as one set (a folder switched by one flip) with a kept previous, a rollback that verifies the
whole set it puts back, today's flat layout read and migrated, and one lock per artifact folder."""

import json
import os
import shutil

import pytest
from store_helpers import debris, state_of

from edge.board import current_system
from edge.errors import EdgeError
from edge.model.artifacts import verify_onnx
from edge.model.plan import FORMATS
from edge.store import artifact as af
from edge.store.artifact import (
    engine_expectations,
    info_path,
    install,
    make_model_info,
    read_model_info,
    rollback,
    sha256_file,
    staging_path,
)

from conftest import assert_refused, run_edge

quiet = lambda *a: None  # noqa: E731


def staged_copy(src, dest):
    staged = staging_path(dest)
    shutil.copyfile(src, staged)
    return staged


def info_for(artifact, source, **extra):
    m = make_model_info(artifact, read_model_info(source), source, fmt="onnx-qdq", precision="int8",
                        calibration={"sha256": "c" * 64, "method": "minmax"}, gate={"passed": True},
                        system=current_system(), build={})
    m.update(extra)
    return m


BAD_MODEL_INFO = [  # (what is written as m.json, what the one line says)
    ("{not json", "not JSON"),
    ("[1, 2]", "boolean 'trained'"),
    ('{"weights": "x"}', "boolean 'trained'"),
    ('{"trained": "yes"}', "boolean 'trained'"),
    ('{"trained": true, "sha256": "abc"}', "64 hex digits"),
    ('{"trained": true, "sha256": 7}', "64 hex digits"),
    ('{"trained": true, "labels_sha256": "abc"}', "64 hex digits"),
    ('{"trained": true, "artifact": "other.int8.onnx"}', "describes 'other.int8.onnx'"),
    (b"\xff\xfe not utf-8", "not UTF-8"),
    ("FOLDER", "not a regular file"),
]


def test_the_one_reader_refuses_every_malformed_model_info_in_one_line(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"model bytes")
    assert read_model_info(str(model)) == {"weights": "yours (no model info)", "trained": True}
    with pytest.raises(EdgeError, match="no model info m.json"):
        read_model_info(str(model), required=True)
    held = 0
    for text, says in BAD_MODEL_INFO:
        info = tmp_path / "m.json"
        shutil.rmtree(str(info), ignore_errors=True) if info.is_dir() else info.unlink() if info.exists() else None
        if text == "FOLDER":
            info.mkdir()
        else:
            info.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(EdgeError) as err:
            read_model_info(str(model))
        assert says in str(err.value) and "\n" not in str(err.value) and str(info) in str(err.value), text
        held += 1
    assert held == len(BAD_MODEL_INFO)


def test_verify_hashes_the_bytes_and_names_the_rebuild_command(small_model, tmp_path):
    artifact = str(tmp_path / "m.int8.onnx")
    staged = staged_copy(small_model, artifact)
    manifest = info_for(staged, small_model, system=dict(current_system(), tensorrt="10.3.0", gpu="Orin"))
    install(artifact, artifact=staged, info=manifest, log=quiet)
    assert read_model_info(artifact)["trained"] is False  # the runtime's reader accepts it
    assert manifest["source"] == {"path": os.path.relpath(small_model, str(tmp_path)),
                                  "sha256": sha256_file(small_model)}
    assert read_model_info(artifact)["sha256"] == sha256_file(artifact)
    assert not os.path.isabs(manifest["source"]["path"])
    ok = {"precision": "int8", "calibration.sha256": "c" * 64, "system.tensorrt": "10.3.0"}
    assert af.verify(artifact, ok, rebuild="edge build --config x.yaml")["precision"] == "int8"
    assert af.is_current(artifact, ok) == (True, "")
    with pytest.raises(EdgeError) as err:
        af.verify(artifact, dict(ok, **{"system.tensorrt": "8.5.2"}), rebuild="edge build --config x.yaml --engine")
    msg = str(err.value)
    assert "built for system.tensorrt '10.3.0', expected '8.5.2'" in msg
    assert msg.endswith("rebuild with: edge build --config x.yaml --engine") and "\n" not in msg
    current, reason = af.is_current(artifact, {"calibration.method": "entropy"})
    assert not current and "calibration.method 'minmax', expected 'entropy'" in reason
    with open(artifact, "ab") as fh:  # through the link: the set's own file
        fh.write(b"\0")
    with pytest.raises(EdgeError, match="differs from the sha256 in its model info"):
        af.verify(artifact)
    os.unlink(os.path.realpath(info_path(artifact)))
    with pytest.raises(EdgeError, match="no model info m.int8.json"):
        af.verify(artifact)
    assert not af.is_current(str(tmp_path / "none.onnx"), {})[0]


def test_engine_model_info_is_checked_against_this_system(tmp_path):
    engine = tmp_path / "m.int8.engine"
    engine.write_bytes(b"serialized engine")
    manifest = {"sha256": sha256_file(str(engine)), "trained": True, "source": {"path": "../models/m.onnx"},
                "system": {"tensorrt": "10.3.0", "gpu": "Orin", "compute_capability": "8.7", "l4t": "R36.4.3"}}
    (tmp_path / "m.int8.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(EdgeError, match=r"built for system.compute_capability '8.7', expected None; "
                                        r"rebuild with: edge build --engine --model ../models/m.onnx"):
        af.check_engine(str(engine))
    here = engine_expectations()
    manifest["system"] = {k.split(".")[1]: v for k, v in here.items()}
    (tmp_path / "m.int8.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert af.check_engine(str(engine))["trained"] is True
    assert FORMATS["tensorrt-engine"].tied_to_board and not FORMATS["onnx-qdq"].tied_to_board


def _install(src, dest, tag, verify=verify_onnx, log=quiet, labels=None):
    """`src` installed at `dest` as build installs (staged copies, the model info, `labels` text or src's)."""
    if labels is not None:
        staged_labels = staging_path(dest[:-5] + ".labels.txt")
        with open(staged_labels, "w", encoding="utf-8") as fh:
            fh.write(labels)
    else:
        staged_labels = staged_copy(src[:-5] + ".labels.txt", dest[:-5] + ".labels.txt") if os.path.exists(
            src[:-5] + ".labels.txt") else None
    staged = staged_copy(src, dest)
    try:
        install(dest, artifact=staged, info=info_for(staged, src, tag=tag), labels=staged_labels,
                verify_staged=verify, log=log)
    finally:
        af.remove_quietly([staged, staged_labels])


def test_install_keeps_previous_and_rollback_swaps(tiny_classifiers, tmp_path):
    first, second = tiny_classifiers
    engines = tmp_path / "engines"
    dest = str(engines / "m.int8.onnx")
    _install(first, dest, "one")
    assert not (engines / "previous" / "m.int8.onnx").exists()  # nothing kept yet
    lines = []
    _install(second, dest, "two", log=lines.append)
    assert "previous kept in previous/" in lines[0]
    assert read_model_info(dest)["labels"] == "m.int8.labels.txt"  # the installed name, never a staging name
    assert sha256_file(dest) == sha256_file(second)
    assert sha256_file(str(engines / "previous" / "m.int8.onnx")) == sha256_file(first)
    assert json.load(open(str(engines / "previous" / "m.int8.json"), encoding="utf-8"))["tag"] == "one"
    assert debris(engines) == []
    rollback(dest, verify_kept=verify_onnx, log=quiet)
    assert sha256_file(dest) == sha256_file(first) and json.load(open(info_path(dest),
                                                                      encoding="utf-8"))["tag"] == "one"
    af.verify(dest)  # the restored model info matches the restored file
    built_at = read_model_info(dest)["built_at"]
    rollback(dest, verify_kept=verify_onnx, log=lines.append)  # and back again, saying what is live now
    assert lines[-1] == "rollback: {} restored from previous/: int8 built {}, gate passed (run rollback again to " \
        "undo)".format(dest, read_model_info(dest)["built_at"]) and built_at
    assert sha256_file(dest) == sha256_file(second) and json.load(open(info_path(dest),
                                                                       encoding="utf-8"))["tag"] == "two"
    assert debris(engines) == []
    with pytest.raises(EdgeError, match="nothing to roll back to"):
        rollback(str(engines / "other.int8.onnx"), log=quiet)


def test_every_file_of_an_artifact_is_0644_whatever_the_umask(tiny_classifiers, tmp_path):
    first, second = tiny_classifiers
    held = 0
    for umask in (0o077, 0o027, 0o002):
        engines = tmp_path / "u{:o}".format(umask) / "engines"
        dest = str(engines / "m.int8.onnx")
        old = os.umask(umask)
        try:
            _install(first, dest, "one")
            _install(second, dest, "two")
            rollback(dest, verify_kept=verify_onnx, log=quiet)
        finally:
            os.umask(old)
        modes = {rel: oct(os.lstat(str(engines / rel)).st_mode & 0o777) for rel, kind in state_of(engines).items()
                 if kind not in ("folder",) and not kind.startswith("link")}
        assert len(modes) == 6 and set(modes.values()) == {"0o644"}, (umask, modes)  # two sets of three files
        held += 1
    assert held == 3


def _planted(engines, dest, plant):
    """One hostile thing in previous/ or in place of the installed files; returns what must not change."""
    prev = engines / "previous"
    outside = engines.parent / "outside.txt"
    outside.write_text("the user's file\n", encoding="utf-8")
    if plant == "artifact is a symlink":
        os.unlink(str(prev / "m.int8.onnx"))
        os.symlink(str(outside), str(prev / "m.int8.onnx"))
    elif plant == "sha mismatch":
        with open(str(prev / "m.int8.onnx"), "ab") as fh:
            fh.write(b"\0")
    elif plant == "folder in place of the model info":
        os.unlink(str(prev / "m.int8.json"))
        (prev / "m.int8.json").mkdir()
    elif plant == "model info is a symlink":
        os.symlink(str(outside), str(engines / "link.json"))
        os.replace(str(engines / "link.json"), str(prev / "m.int8.json"))
    elif plant == "no model info":
        os.unlink(os.path.realpath(str(prev / "m.int8.json")))
    elif plant == "previous labels edited":
        with open(str(prev / "m.int8.labels.txt"), "a", encoding="utf-8") as fh:  # the kept set's own labels file
            fh.write("one label too many\n")
    elif plant == "not a model, sha matches":
        (prev / "m.int8.onnx").write_bytes(b"not onnx")
        info = json.loads((prev / "m.int8.json").read_text(encoding="utf-8"))
        info["sha256"] = sha256_file(str(prev / "m.int8.onnx"))
        (prev / "m.int8.json").write_text(json.dumps(info), encoding="utf-8")
    elif plant == "previous is a symlink":
        elsewhere = engines.parent / "elsewhere"
        shutil.move(str(prev), str(elsewhere))
        os.symlink(str(elsewhere), str(prev))
    elif plant == "installed labels are a symlink":
        os.unlink(str(engines / "m.int8.labels.txt"))
        os.symlink(str(outside), str(engines / "m.int8.labels.txt"))
    return outside


ROLLBACK_PLANTS = ("artifact is a symlink", "sha mismatch", "folder in place of the model info",
                   "model info is a symlink", "no model info", "not a model, sha matches", "previous is a symlink",
                   "installed labels are a symlink", "previous labels edited")


def test_rollback_verifies_what_it_puts_back_and_changes_nothing_otherwise(tiny_classifiers, tmp_path):
    first, second = tiny_classifiers
    held = 0
    for n, plant in enumerate(ROLLBACK_PLANTS):
        engines = tmp_path / str(n) / "engines"
        dest = str(engines / "m.int8.onnx")
        _install(first, dest, "one")
        _install(second, dest, "two")
        outside = _planted(engines, dest, plant)
        before, outside_before = state_of(engines.parent), outside.read_text(encoding="utf-8")
        with pytest.raises(EdgeError) as err:
            rollback(dest, verify_kept=verify_onnx, log=quiet)
        assert "\n" not in str(err.value) and "engines" in str(err.value), (plant, err.value)
        assert state_of(engines.parent) == before, plant  # nothing swapped, no .staged or .swap left
        assert outside.read_text(encoding="utf-8") == outside_before
        held += 1
    assert held == len(ROLLBACK_PLANTS)
    # the CLI says it in one line, exit 2
    proc = run_edge("rollback", "--artifact", str(tmp_path / "0" / "engines" / "m.int8.onnx"))
    assert_refused(proc, "m.int8.onnx", "symlink")


def test_a_previous_that_is_a_symlink_is_never_written_through(tiny_classifiers, tmp_path):
    first, second = tiny_classifiers
    engines = tmp_path / "engines"
    dest = str(engines / "m.int8.onnx")
    _install(first, dest, "one")
    target = tmp_path / "target"
    target.mkdir()
    shutil.rmtree(str(engines / "previous"), ignore_errors=True)
    os.symlink(str(target), str(engines / "previous"))
    before = state_of(tmp_path)
    with pytest.raises(EdgeError, match="previous: is not a folder .*refusing to write through it"):
        _install(second, dest, "two")
    assert os.listdir(str(target)) == []
    assert {k: v for k, v in state_of(tmp_path).items() if ".staged" not in k} == before




def labelled(dest, model, tag):
    """`model` installed at `dest` with labels of its own (tag0..tag9), as a build installs."""
    _install(model, dest, tag, labels="".join("{}{}\n".format(tag, i) for i in range(10)))


def test_one_writer_at_a_time_the_second_is_one_line_exit_2(tiny_classifiers, tmp_path):
    """Two rollbacks at once once left artifact B with A's model info and labels, and no way back."""
    dest = str(tmp_path / "engines" / "m.int8.onnx")
    labelled(dest, tiny_classifiers[0], "a")
    labelled(dest, tiny_classifiers[1], "b")
    before = state_of(tmp_path / "engines")
    with af.writing(str(tmp_path / "engines"), "edge build"):  # a build (or rebuild, fetch, export) is running
        proc = run_edge("rollback", "--artifact", dest)
        assert_refused(proc, str(tmp_path / "engines"), "in use by another edge command",
                       "pid {}".format(os.getpid()))  # the holder, named
        assert {k: v for k, v in state_of(tmp_path / "engines").items() if k != ".lock"} == before
    assert not os.path.lexists(str(tmp_path / "engines" / ".lock"))  # a lock file only while held
    assert run_edge("rollback", "--artifact", dest).returncode == 0  # once it has ended
    assert af.read_set(dest).labels == ["a{}".format(i) for i in range(10)]


def test_a_torn_or_stale_set_is_refused_at_load_on_every_path(tiny_classifiers, tmp_path):
    """The ONNX path too: labels that are not the ones the model info records, or bytes it does not describe."""
    dest = str(tmp_path / "engines" / "m.int8.onnx")
    labelled(dest, tiny_classifiers[0], "a")
    image = tmp_path / "a.png"
    __import__("cv2").imwrite(str(image), __import__("numpy").zeros((32, 32, 3), "uint8"))
    assert run_edge("classify", image, "--model", dest).returncode == 0
    labels = os.path.realpath(dest[:-5] + ".labels.txt")
    with open(labels, encoding="utf-8") as fh:
        names = fh.read().splitlines()
    names[0], names[1] = names[1], names[0]  # two class names swapped: same count, wrong names
    with open(labels, "w", encoding="utf-8") as fh:
        fh.write("\n".join(names) + "\n")
    assert_refused(run_edge("classify", image, "--model", dest), dest, "labels are not the ones")
    assert_refused(run_edge("run", "--model", dest, "--source", "synthetic"), dest, "labels are not the ones")
    plain = tmp_path / "plain"  # an export's flat files: a model replaced by hand beside its old model info
    plain.mkdir()
    for ext in (".onnx", ".json", ".labels.txt"):
        shutil.copyfile(tiny_classifiers[0][:-5] + ext, str(plain / ("m" + ext)))
    shutil.copyfile(tiny_classifiers[1], str(plain / "m.onnx"))
    assert_refused(run_edge("classify", image, "--model", plain / "m.onnx"), plain / "m.onnx",
                   "differs from the sha256 in its model info")


def test_todays_flat_layout_loads_as_is_and_the_first_writer_migrates_it(tiny_classifiers, tmp_path):
    engines = tmp_path / "engines"
    (engines / "previous").mkdir(parents=True)
    for base, model, tag in ((engines / "previous", tiny_classifiers[0], "a"), (engines, tiny_classifiers[1], "b")):
        shutil.copyfile(model, str(base / "m.int8.onnx"))  # what an install wrote before sets: files, no labels hash
        (base / "m.int8.labels.txt").write_text("".join("{}{}\n".format(tag, i) for i in range(10)), encoding="utf-8")
        (base / "m.int8.json").write_text(json.dumps({"trained": False, "sha256": sha256_file(model),
                                                      "artifact": "m.int8.onnx", "tag": tag}), encoding="utf-8")
    dest = str(engines / "m.int8.onnx")
    model = af.read_set(dest)
    assert model.labels[0] == "b0" and "not covered by a sha256" in model.notes[0]
    proc = run_edge("rollback", "--artifact", dest)
    assert proc.returncode == 0, proc.stderr
    assert af.read_set(dest).labels[0] == "a0" and os.path.islink(dest)
    assert sorted(os.listdir(str(engines / "m.int8.onnx.sets"))) == ["0001", "0002", "current"]
    assert run_edge("rollback", "--artifact", dest).returncode == 0
    assert af.read_set(dest).labels[0] == "b0" and af.read_set(str(engines / "previous" / "m.int8.onnx")).labels[0] \
        == "a0"


def test_the_next_writer_sweeps_what_a_killed_one_left(tiny_classifiers, tmp_path):
    engines = tmp_path / "engines"
    dest = str(engines / "m.int8.onnx")
    labelled(dest, tiny_classifiers[0], "a")
    labelled(dest, tiny_classifiers[1], "b")
    kept = state_of(engines)
    left = [engines / ".m.int8.onnx.0123456789abcdef.staged", engines / ".m.int8.qdq.onnx.fedcba9876543210.staged",
            engines / ".m.int8.gate.json.00112233445566aa.tmp", engines / "m.int8.onnx.sets" / ".new-0123456789abcdef",
            engines / ".cache-0123456789abcdef.aabbccddeeff0011", engines / "m.int8.onnx.sets" / "0009"]
    for path in left:
        if path.name.startswith(".new") or path.name.startswith(".cache") or path.name == "0009":
            path.mkdir()
            (path / "m.int8.onnx").write_bytes(b"x" * 1000)  # a half-made set, an unfinished download
        else:
            path.write_bytes(b"x" * 1000)
    (engines / "notes.txt").write_text("the user's own file\n", encoding="utf-8")
    with af.writing(str(engines), "test"):
        af.rollback(dest, log=quiet)
        af.rollback(dest, log=quiet)
    assert [p for p in left if os.path.lexists(str(p))] == []
    after = {k: v for k, v in state_of(engines).items() if k != "m.int8.onnx.sets/0001/previous"}  # set by the rollback
    assert after == dict(kept, **{"notes.txt": sha256_file(str(engines / "notes.txt"))})


def _engine(engines, dest, tag):
    """A stand-in engine installed at `dest` (the store does not read what the bytes mean)."""
    staged = str(engines.parent / "staged.engine")
    with open(staged, "wb") as fh:
        fh.write(tag.encode())
    install(dest, artifact=staged, info=dict(info_for(staged, staged, tag=tag), format="tensorrt-engine"),
            log=quiet)


def test_an_engine_install_leaves_the_int8_onnx_of_its_stem_served_and_rolled_back(tiny_classifiers, tmp_path):
    engines = tmp_path / "engines"
    onnx, engine = str(engines / "m.int8.onnx"), str(engines / "m.int8.engine")
    _install(tiny_classifiers[0], onnx, "one")
    _install(tiny_classifiers[1], onnx, "two")
    _engine(engines, engine, "engine")  # one stem, another artifact: its own sets (issue 42: it left onnx dangling)
    assert af.read_set(onnx).sha256 == sha256_file(tiny_classifiers[1]) and read_model_info(onnx)["tag"] == "two"
    assert read_model_info(engine)["tag"] == "engine" and debris(engines) == []
    rollback(onnx, verify_kept=verify_onnx, log=quiet)
    assert af.read_set(onnx).sha256 == sha256_file(tiny_classifiers[0]) and read_model_info(engine)["tag"] == "engine"


def test_the_sets_a_stem_shared_before_split_under_each_artifact(tiny_classifiers, tmp_path, monkeypatch):
    from edge.store import layout

    engines = tmp_path / "engines"
    onnx, engine = str(engines / "m.int8.onnx"), str(engines / "m.int8.engine")
    with monkeypatch.context() as before:  # the layout before: one m.int8.sets for both
        before.setattr(layout, "sets_dir", layout._shared_dir)
        before.setattr(layout, "_unshare", lambda dest, names: None)
        _install(tiny_classifiers[1], onnx, "two")
        _engine(engines, engine, "engine")
    assert os.path.islink(onnx) and not os.path.exists(onnx)  # the engine's set left it naming nothing
    assert os.readlink(onnx) == "m.int8.sets/current/m.int8.onnx"
    _engine(engines, engine, "engine2")  # the next writer splits the shared sets
    assert af.read_set(onnx).sha256 == sha256_file(tiny_classifiers[1]) and read_model_info(onnx)["tag"] == "two"
    assert read_model_info(engine)["tag"] == "engine2"
    assert read_model_info(str(engines / "previous" / "m.int8.engine"))["tag"] == "engine"
    assert sorted(n for n in os.listdir(str(engines)) if n.endswith(".sets")) == ["m.int8.engine.sets",
                                                                                   "m.int8.onnx.sets"]
    assert debris(engines) == []
    rollback(engine, log=quiet)
    assert read_model_info(engine)["tag"] == "engine" and read_model_info(onnx)["tag"] == "two"
