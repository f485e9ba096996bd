"""edge.cli.release (`edge release`): the lease's arguments are checked before the shared store is touched, in one
line, exit 2. (The releases themselves: test_fleet_releases.py.)"""

import os

import pytest

from edge.cli.main import main


@pytest.mark.parametrize("args", [["--store", "relative/store", "--run", "r1"], ["--run", "r1"],
                                  ["--store", "https://store.example/x", "--run", "r1"], ["--store", "STORE"]])
def test_a_lease_without_an_absolute_store_folder_and_a_run_id_is_refused_in_one_line(tmp_path, capsys, args):
    args = [str(tmp_path) if a == "STORE" else a for a in args]
    assert main(["release", "lease", "v2", *args]) == 2
    assert capsys.readouterr().err == ("edge release: error: edge release lease: --store must be the store's "
                                       "absolute folder and --run an id\n")
    assert os.listdir(str(tmp_path)) == []
