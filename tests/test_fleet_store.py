"""edge.fleet.store: the rollout records every controller and device sees, in a folder store beside the shared
engine cache; an https:// store is read only, and a record that is not one is refused in one line naming it."""

import json
import os

import pytest

from edge.errors import EdgeError
from edge.fleet import store

RECORD = {"release": "r7", "state": "withdrawn", "why": "bad labels", "sha256": "ab" * 32, "at": 1.0, "by": "alice"}


def test_a_record_written_is_read_by_every_reader_until_cleared(tmp_path):
    folder = str(tmp_path)
    assert store.read(folder, "r7") is None
    assert store.write(folder, RECORD)
    assert store.read(folder, "r7") == RECORD
    assert json.loads((tmp_path / "rollout" / "r7.json").read_text(encoding="utf-8")) == RECORD
    assert store.clear(folder, "r7") and store.read(folder, "r7") is None
    assert not store.clear(folder, "r7")  # nothing left to clear


def test_no_store_and_an_https_store_are_never_written(tmp_path):
    assert store.read("", "r7") is None
    assert not store.write("", RECORD) and not store.clear("", "r7")
    assert not store.write("https://cache.example/engines", RECORD)
    assert not store.clear("https://cache.example/engines", "r7")


def test_a_missing_store_folder_is_refused_naming_it(tmp_path):
    missing = str(tmp_path / "nfs")
    with pytest.raises(EdgeError, match="nfs: the shared engine cache folder does not exist"):
        store.write(missing, RECORD)
    assert not os.path.exists(missing)


@pytest.mark.parametrize("text", ['{"release": "r7", "state": "committed"}', "[1, 2]", "not json"])
def test_a_file_that_is_not_a_record_is_refused_in_one_line(tmp_path, text):
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout" / "r7.json").write_text(text, encoding="utf-8")
    with pytest.raises(EdgeError) as refused:
        store.read(str(tmp_path), "r7")
    line = str(refused.value)
    assert "\n" not in line and "r7.json" in line


@pytest.fixture
def read_only(tmp_path):
    """A folder store mounted read only (an NFS export mounted ro): `make(with_records)` fills it, then mounts it
    over itself read only. Needs root's mount (the suite runs as root); skipped where it cannot mount."""
    import subprocess

    folder = tmp_path / "nfs"
    mounted = []

    def make(with_records):
        folder.mkdir()
        if with_records:
            store.write(str(folder), RECORD)
        for args in (["--bind", str(folder), str(folder)], ["-o", "remount,ro,bind", str(folder)]):
            done = subprocess.run(["mount"] + args, capture_output=True, encoding="utf-8", errors="replace")
            if done.returncode != 0:
                pytest.skip("cannot mount here: " + done.stderr.strip())
            mounted[:] = [folder]
        return str(folder)

    yield make
    for path in mounted:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("with_records", [False, True])
def test_a_read_only_store_is_read_and_its_write_is_refused_naming_the_path(read_only, with_records):
    from conftest import assert_refused, run_edge

    folder = read_only(with_records)
    assert store.read(folder, "r7") == (RECORD if with_records else None)
    where = os.path.join(folder, "rollout") if not with_records else os.path.join(folder, "rollout", "r7.json")
    with pytest.raises((EdgeError, OSError), match="Read-only file system") as raised:
        store.write(folder, dict(RECORD, why="again"))
    assert where in str(raised.value), raised.value  # the store's path, not a temporary name
    lease = run_edge("release", "lease", "r8", "--store", folder, "--run", "ci-1")
    assert_refused(lease, os.path.join(folder, "rollout"), "Read-only file system")
