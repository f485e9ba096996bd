"""edge.cli.init: `edge init FOLDER` writes every shipped file (calibration sets, example config, unit, constraints)
as shipped, and into a folder that has any of them already it writes nothing, naming them."""

import filecmp
import os

import pytest

from edge.cli.init import shipped_files, shipped_root, write_out
from edge.errors import EdgeError


def test_every_shipped_file_is_written_as_shipped_and_a_second_init_writes_nothing(tmp_path):
    root = shipped_root()
    files = shipped_files(root)
    assert "configs/example.yaml" in files and any(f.startswith("calibration/default/") for f in files)
    count, source = write_out(str(tmp_path))
    assert (count, source) == (len(files), root)
    written = sorted(os.path.relpath(os.path.join(folder, name), str(tmp_path))
                     for folder, _, names in os.walk(str(tmp_path)) for name in names)
    assert written == sorted(files)  # nothing else: no temporary file left
    assert all(filecmp.cmp(os.path.join(root, f), str(tmp_path / f), shallow=False) for f in files)
    os.unlink(str(tmp_path / "configs" / "example.yaml"))
    with pytest.raises(EdgeError, match=r"already has {} of these files \(calibration/.*\): nothing written".format(
            len(files) - 1)):
        write_out(str(tmp_path))
    assert not (tmp_path / "configs" / "example.yaml").exists()
