"""edge.store.layout: an artifact's fixed names over numbered sets. Readers resolve `current` once (every file from
one set), a commit keeps the replaced set reachable under previous/, and today's flat files migrate with the same
bytes at the same names."""

import os

from edge.store import layout, versions

NAMES = ("m.onnx", "m.json")


def files(tmp_path, tag):
    out = {}
    for name in NAMES:
        path = tmp_path / "src" / tag / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{} {}\n".format(tag, name), encoding="utf-8")
        out[name] = str(path)
    return out


def read(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def test_commits_switch_every_name_at_once_and_keep_the_replaced_set_as_previous(tmp_path):
    folder = tmp_path / "engines"
    folder.mkdir()
    dest = str(folder / "m.onnx")
    with versions.lock(str(folder), "test"):
        first = layout.commit(dest, files(tmp_path, "one"), keep_previous=True)
        second = layout.commit(dest, files(tmp_path, "two"), keep_previous=True)
    assert layout.sets_dir(dest) == str(folder / "m.onnx.sets") and first != second
    assert [read(str(folder / n)) for n in NAMES] == ["two m.onnx\n", "two m.json\n"]
    assert [read(str(folder / "previous" / n)) for n in NAMES] == ["one m.onnx\n", "one m.json\n"]
    assert layout.resolve(dest) == (second, True)
    assert layout.resolve(str(folder / "previous" / "m.onnx")) == (first, True)
    assert layout.previous_set(dest, layout.current_set(dest)) == os.path.basename(first)
    with versions.lock(str(folder), "test"):
        layout.swap_with_previous(dest)  # a rollback: one flip, the names follow
    assert read(dest) == "one m.onnx\n" and layout.resolve(dest) == (first, True)


def test_a_plain_file_resolves_beside_itself(tmp_path):
    (tmp_path / "mine.onnx").write_text("x", encoding="utf-8")
    assert layout.resolve(str(tmp_path / "mine.onnx")) == (str(tmp_path), False)


def test_todays_flat_files_migrate_as_the_same_bytes_at_the_same_names(tmp_path):
    folder = tmp_path / "engines"
    (folder / "previous").mkdir(parents=True)
    for name in NAMES:
        (folder / name).write_text("new " + name, encoding="utf-8")
        (folder / "previous" / name).write_text("old " + name, encoding="utf-8")
    dest = str(folder / "m.onnx")
    with versions.lock(str(folder), "test"):
        assert layout.migrate(dest, NAMES)
        assert not layout.migrate(dest, NAMES)  # once
    assert [read(str(folder / n)) for n in NAMES] == ["new m.onnx", "new m.json"]
    assert [read(str(folder / "previous" / n)) for n in NAMES] == ["old m.onnx", "old m.json"]
    assert all(os.path.islink(str(folder / n)) for n in NAMES) and layout.resolve(dest)[1]


def test_the_sets_of_an_artifact_without_a_suffix_are_never_taken_for_a_stems_shared_ones(tmp_path):
    folder = tmp_path / "engines"
    folder.mkdir()
    bare, other = str(folder / "m"), str(folder / "m.onnx")
    with versions.lock(str(folder), "test"):
        layout.commit(bare, {"m": files(tmp_path, "one")["m.onnx"]}, keep_previous=True)
        layout.settle(other, NAMES)  # m.sets is m's own, named from its whole name
        layout.settle(bare, ["m"])
    assert layout.sets_dir(bare) == str(folder / "m.sets") and read(bare) == "one m.onnx\n"
