"""edge.store.fileio: a file written whole or not at all (the old one stays until the new one is complete, with
its permissions), outputs refused before any work, and temporary folders gone however their block ends."""

import json
import os
import stat

import pytest

from edge.errors import EdgeError
from edge.store import fileio


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.json"
    fileio.write_json_atomic(str(path), {"v": 1})
    os.chmod(str(path), 0o640)

    def half(fh):
        fh.write(b'{"v": ')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        fileio.atomic_write(str(path), half)
    assert json.loads(path.read_text(encoding="utf-8")) == {"v": 1} and os.listdir(str(tmp_path)) == ["report.json"]
    fileio.write_json_atomic(str(path), {"v": 2, "password": "x"})
    assert json.loads(path.read_text(encoding="utf-8"))["v"] == 2
    assert stat.S_IMODE(os.stat(str(path)).st_mode) == 0o640  # a replaced file keeps its permissions


def test_an_output_that_is_not_a_regular_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(EdgeError, match=r"dir.json: cannot write the JSON report: it is a folder"):
        fileio.check_output(str(tmp_path / "dir.json"), "JSON report")
    (tmp_path / "ro").mkdir()
    os.chmod(str(tmp_path / "ro"), 0o500)
    try:
        if not os.access(str(tmp_path / "ro"), os.W_OK):  # root writes anywhere
            with pytest.raises(EdgeError, match="is not a writable folder"):
                fileio.check_output(str(tmp_path / "ro" / "new" / "out.png"), "figure")
    finally:
        os.chmod(str(tmp_path / "ro"), 0o700)
    fileio.check_output(str(tmp_path / "new" / "deeper" / "out.json"))  # missing folders are made by the writer


def test_a_temporary_folder_is_gone_however_its_block_ends(tmp_path):
    with fileio.temp_dir(str(tmp_path / "parent"), ".work-") as work:
        (tmp_path / "parent" / os.path.basename(work) / "f").write_text("x", encoding="utf-8")
        assert os.path.basename(work).startswith(".work-")
    assert os.listdir(str(tmp_path / "parent")) == []
    with pytest.raises(RuntimeError):
        with fileio.temp_dir(str(tmp_path / "parent"), ".work-"):
            raise RuntimeError("failed step")
    assert os.listdir(str(tmp_path / "parent")) == []


def test_a_write_fsyncs_its_folder_and_one_through_a_folder_descriptor_stays_in_that_folder(tmp_path, monkeypatch):
    """The folder is fsynced after the rename. Root's release state (edge.fleet.statedir) writes through the one
    writer relative to the folder it walked without links (`dir_fd`): the file lands there even once the path
    names another folder, and a link at the name is refused in one line, kept, and nothing is written through it."""
    synced = []
    monkeypatch.setattr(fileio, "fsync_path", lambda p: synced.append(p))
    fileio.write_json_atomic(str(tmp_path / "report.json"), {"v": 1})
    assert synced == [str(tmp_path)]
    walked, moved = tmp_path / "state", tmp_path / "moved"
    walked.mkdir()
    fd = os.open(str(walked), os.O_RDONLY | os.O_DIRECTORY)
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda n: (real_fsync(n), synced.append(n))[0])
    try:
        os.rename(str(walked), str(moved))
        walked.mkdir()  # the path now names another folder
        fileio.write_json_atomic(str(walked / "trial.json"), {"v": 2}, "state file", dir_fd=fd)
        assert json.loads((moved / "trial.json").read_text(encoding="utf-8")) == {"v": 2} and synced[-1] == fd
        assert os.listdir(str(walked)) == []
        victim = tmp_path / "victim"
        victim.write_text("root's file\n", encoding="utf-8")
        os.symlink(str(victim), str(moved / "GATED"))
        with pytest.raises(EdgeError, match=r"state/GATED: cannot write the state file: it is a symlink"):
            fileio.write_json_atomic(str(walked / "GATED"), {}, "state file", dir_fd=fd)
        assert victim.read_text(encoding="utf-8") == "root's file\n" and os.path.islink(str(moved / "GATED"))
        assert sorted(os.listdir(str(moved))) == ["GATED", "trial.json"]
    finally:
        os.close(fd)
