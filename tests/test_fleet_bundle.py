"""edge/fleet/bundle.py and `edge cache bundle`: a release's files packed once into the shared store, the same
bytes for the same files, named by their sha256 (what the devices after each canary fetch and verify)."""

import hashlib
import os
import subprocess
import sys
import tarfile

import pytest

from edge.errors import EdgeError
from edge.fleet import bundle


def release_files(base):
    sets = base / "cal"
    (sets / "sub").mkdir(parents=True)
    (sets / "b.jpg").write_bytes(b"b" * 100)
    (sets / "sub" / "a.jpg").write_bytes(b"a" * 10)
    (base / "m.onnx").write_bytes(b"onnx")
    return [("models/m.onnx", str(base / "m.onnx")), ("calibration/default", str(sets))]


def test_the_same_files_make_the_same_bundle_written_once(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    members = release_files(tmp_path)
    logged = []
    sha = bundle.pack(str(store), members, log=logged.append)
    tar = store / "bundle" / (sha + ".tar")
    assert hashlib.sha256(tar.read_bytes()).hexdigest() == sha
    with tarfile.open(str(tar)) as fh:
        infos = fh.getmembers()
        assert [i.name for i in infos] == ["calibration/default", "calibration/default/b.jpg",
                                           "calibration/default/sub", "calibration/default/sub/a.jpg",
                                           "models/m.onnx"]
        assert {(i.mtime, i.uid, i.gid, i.uname) for i in infos} == {(0, 0, 0, "")}
        assert [oct(i.mode) for i in infos if i.isfile()] == ["0o644"] * 3
        assert fh.extractfile("calibration/default/sub/a.jpg").read() == b"a" * 10
    os.utime(str(tmp_path / "m.onnx"), (1, 1))  # times are not content
    before = tar.stat().st_mtime_ns
    assert bundle.pack(str(store), list(reversed(members)), log=logged.append) == sha
    assert tar.stat().st_mtime_ns == before and "holds it already" in logged[-1]
    (tmp_path / "cal" / "b.jpg").write_bytes(b"c" * 100)
    assert bundle.pack(str(store), members, log=logged.append) != sha
    assert len(os.listdir(str(store / "bundle"))) == 2


def test_a_link_a_missing_store_and_a_name_outside_the_bundle_are_refused_in_one_line(tmp_path):
    store = tmp_path / "store"
    members = release_files(tmp_path)
    with pytest.raises(EdgeError, match="the shared store folder does not exist"):
        bundle.pack(str(store), members)
    store.mkdir()
    os.symlink("/etc/passwd", str(tmp_path / "cal" / "link.jpg"))
    with pytest.raises(EdgeError, match=r"cal/link.jpg: a symlink in the release bundle; give the file itself"):
        bundle.pack(str(store), members)
    with pytest.raises(EdgeError, match="not a relative name inside the bundle"):
        bundle.pack(str(store), [("../m.onnx", members[0][1])])
    with pytest.raises(EdgeError, match="a name given twice"):
        bundle.pack(str(store), [members[0], members[0]])
    assert not (store / "bundle").exists()


def test_edge_cache_bundle_prints_the_sha256_last_and_refuses_a_bad_add_in_one_line(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    members = release_files(tmp_path)
    run = subprocess.run([sys.executable, "-m", "edge", "cache", "bundle", str(store)]
                         + ["--add={}={}".format(n, p) for n, p in members], capture_output=True, encoding="utf-8",
                         timeout=120)
    assert run.returncode == 0, run.stderr
    sha = run.stdout.splitlines()[-1]
    assert (store / "bundle" / (sha + ".tar")).is_file() and "release bundle: packed" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "edge", "cache", "bundle", str(store), "--add", "models/m.onnx"],
                         capture_output=True, encoding="utf-8", timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("give each file or folder as --add "
                                                                                "NAME=PATH"), bad.stderr
    assert "Traceback" not in bad.stderr
