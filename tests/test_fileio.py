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
