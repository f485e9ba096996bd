"""edge.cli.cache (`edge cache`): a fetch that misses is exit 1 and installs nothing; a bundle given a file without its
NAME= is one line, exit 2, and packs nothing. (Hits, publishing and the https cache: test_fleet_engine_cache.py.)"""

import os

import service_helpers as sh

from edge.cli.main import main


def test_a_fetch_from_a_cache_without_the_entry_is_exit_1_and_installs_nothing(small_model, tmp_path, capsys):
    model = sh.copy_model(small_model, str(tmp_path / "engines"), "m")
    before = sorted(os.listdir(str(tmp_path / "engines")))
    (tmp_path / "cache").mkdir()
    assert main(["cache", "fetch", str(tmp_path / "cache"), "--model", model]) == 1
    assert "engine cache: miss " in capsys.readouterr().out
    assert sorted(os.listdir(str(tmp_path / "engines"))) == before and os.listdir(str(tmp_path / "cache")) == []


def test_a_bundle_file_without_its_name_is_one_line_and_packs_nothing(tmp_path, capsys):
    (tmp_path / "store").mkdir()
    (tmp_path / "model.onnx").write_bytes(b"x")
    assert main(["cache", "bundle", str(tmp_path / "store"), "--add", str(tmp_path / "model.onnx")]) == 2
    assert capsys.readouterr().err == ("edge cache: error: edge cache bundle: give each file or folder as "
                                       "--add NAME=PATH\n")
    assert os.listdir(str(tmp_path / "store")) == []
