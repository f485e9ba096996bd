"""Artifact manifests, the refusal of a mismatched artifact, atomic install with a kept previous, rollback."""

import errno
import json
import os
import shutil

import pytest

from edge.board import check_engine_manifest, check_manifest, current_system, engine_expectations, read_l4t
from edge.build import artifacts
from edge.build.artifacts import (
    artifact_is_current,
    install,
    make_manifest,
    rollback,
    staging_path,
    verify_onnx,
)
from edge.build.plan import FORMATS
from edge.errors import EdgeError
from edge.modelinfo import info_path, read_model_info, sha256_file

quiet = lambda *a: None  # noqa: E731


def snapshot(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = sha256_file(path)
    return out


def staged_copy(src, dest):
    staged = staging_path(dest)
    shutil.copyfile(src, staged)
    return staged


def manifest_for(artifact, source, **extra):
    m = make_manifest(artifact, read_model_info(source), source, "onnx-qdq", "int8",
                      {"sha256": "c" * 64, "method": "minmax"}, {"passed": True}, current_system(), {})
    m.update(extra)
    return m


def test_read_l4t(tmp_path):
    release = tmp_path / "etc" / "nv_tegra_release"
    release.parent.mkdir()
    release.write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: ...\n")
    assert read_l4t(str(tmp_path)) == "R36.4.3"
    assert read_l4t(str(tmp_path / "missing")) is None


def test_current_system_on_this_cpu_machine():
    import onnxruntime

    system = current_system(root="/nonexistent")
    assert system["onnxruntime"] == onnxruntime.__version__
    assert system["l4t"] is None
    assert system["tensorrt"] is None  # tensorrt-stubs installs a `tensorrt` package without a runtime
    assert set(system) >= {"tensorrt", "gpu", "compute_capability", "l4t", "onnxruntime", "machine"}


def test_manifest_extends_model_info_and_mismatch_is_refused_with_rebuild_command(small_model, tmp_path):
    artifact = str(tmp_path / "m.int8.onnx")
    shutil.copyfile(small_model, artifact)
    manifest = manifest_for(artifact, small_model, system=dict(current_system(), tensorrt="10.3.0", gpu="Orin"))
    artifacts.write_json_atomic(info_path(artifact), manifest)
    assert read_model_info(artifact)["trained"] is False  # the runtime's reader accepts it
    assert manifest["source"]["sha256"] == sha256_file(small_model) and manifest["sha256"] == sha256_file(artifact)
    ok = {"precision": "int8", "calibration.sha256": "c" * 64, "system.tensorrt": "10.3.0"}
    check_manifest(artifact, ok, "edge build --config x.yaml")
    assert artifact_is_current(artifact, ok) == (True, "")
    with pytest.raises(EdgeError) as err:
        check_manifest(artifact, dict(ok, **{"system.tensorrt": "8.5.2"}), "edge build --config x.yaml --engine")
    msg = str(err.value)
    assert "built for system.tensorrt '10.3.0', expected '8.5.2'" in msg
    assert msg.endswith("rebuild with: edge build --config x.yaml --engine") and "\n" not in msg
    current, reason = artifact_is_current(artifact, {"calibration.method": "entropy"})
    assert not current and "calibration.method 'minmax', expected 'entropy'" in reason
    with open(artifact, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(EdgeError, match="differs from the sha256 in its manifest"):
        check_manifest(artifact, {})
    os.unlink(info_path(artifact))
    with pytest.raises(EdgeError, match="no readable manifest"):
        check_manifest(artifact, {})
    assert not artifact_is_current(str(tmp_path / "none.onnx"), {})[0]


def test_engine_manifest_is_checked_against_this_system(tmp_path):
    engine = tmp_path / "m.int8.engine"
    engine.write_bytes(b"serialized engine")
    manifest = {"sha256": sha256_file(str(engine)), "trained": True, "source": {"path": "/e/m.onnx"},
                "system": {"tensorrt": "10.3.0", "gpu": "Orin", "compute_capability": "8.7", "l4t": "R36.4.3"}}
    (tmp_path / "m.int8.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgeError, match=r"built for system.compute_capability '8.7', expected None; "
                                        r"rebuild with: edge build --engine --model /e/m.onnx"):
        check_engine_manifest(str(engine))
    here = engine_expectations()
    manifest["system"] = {k.split(".")[1]: v for k, v in here.items()}
    (tmp_path / "m.int8.json").write_text(json.dumps(manifest))
    assert check_engine_manifest(str(engine))["trained"] is True
    assert FORMATS["tensorrt-engine"].tied_to_board and not FORMATS["onnx-qdq"].tied_to_board


def test_install_keeps_previous_and_rollback_swaps(small_model, digits_onnx_pair, tmp_path):
    first, second = digits_onnx_pair
    engines = tmp_path / "engines"
    dest = str(engines / "m.int8.onnx")
    staged = staged_copy(first, dest)
    install(staged, dest, manifest_for(staged, first, tag="one"), verify=verify_onnx, log=quiet)
    assert not (engines / "previous").exists()
    lines = []
    staged = staged_copy(second, dest)
    install(staged, dest, manifest_for(staged, second, tag="two"), verify=verify_onnx, log=lines.append)
    assert "previous kept in previous/" in lines[0]
    assert sha256_file(dest) == sha256_file(second)
    assert sha256_file(str(engines / "previous" / "m.int8.onnx")) == sha256_file(first)
    assert json.load(open(str(engines / "previous" / "m.int8.json")))["tag"] == "one"
    assert [n for n in os.listdir(str(engines)) if n.startswith(".")] == []
    rollback(dest, log=quiet)
    assert sha256_file(dest) == sha256_file(first) and json.load(open(info_path(dest)))["tag"] == "one"
    check_manifest(dest, {})  # the restored manifest matches the restored file
    rollback(dest, log=quiet)  # and back again
    assert sha256_file(dest) == sha256_file(second) and json.load(open(info_path(dest)))["tag"] == "two"
    with pytest.raises(EdgeError, match="nothing to roll back to"):
        rollback(str(engines / "other.int8.onnx"), log=quiet)


def test_failed_verification_or_full_disk_leaves_installed_artifact_untouched(digits_onnx_pair, tmp_path,
                                                                               monkeypatch):
    first, second = digits_onnx_pair
    engines = tmp_path / "engines"
    dest = str(engines / "m.int8.onnx")
    staged = staged_copy(first, dest)
    install(staged, dest, manifest_for(staged, first), log=quiet)
    before = snapshot(str(engines))
    corrupt = staging_path(dest)
    with open(corrupt, "wb") as fh:
        fh.write(b"not onnx")
    with pytest.raises(EdgeError, match="verification failed"):
        install(corrupt, dest, {}, verify=verify_onnx, log=quiet)
    os.unlink(corrupt)
    assert snapshot(str(engines)) == before

    staged = staged_copy(second, dest)
    install(staged, dest, manifest_for(staged, second), verify=verify_onnx, log=quiet)  # previous/ = first
    before = snapshot(str(engines))
    real, calls = artifacts._link_or_copy, []

    def disk_full_on_second_copy(src, dst):  # the artifact is backed up, its manifest is not
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", dst)
        real(src, dst)

    monkeypatch.setattr(artifacts, "_link_or_copy", disk_full_on_second_copy)
    staged = staged_copy(first, dest)
    with pytest.raises(OSError, match="No space left"):
        install(staged, dest, manifest_for(staged, first), verify=verify_onnx, log=quiet)
    os.unlink(staged)
    assert len(calls) == 2
    assert snapshot(str(engines)) == before  # installed and previous/ both unchanged and consistent
    assert [n for n in os.listdir(str(engines)) if n.startswith(".")] == []
    assert [n for n in os.listdir(str(engines / "previous")) if n.endswith(".tmp")] == []


@pytest.fixture(scope="module")
def digits_onnx_pair(tmp_path_factory):
    """Two different small valid ONNX models (random MobileNetV3-Small, two seeds)."""
    from edge.build.export import export_mobilenet

    folder = tmp_path_factory.mktemp("pair")
    paths = []
    for seed in (1, 2):
        path = str(folder / "m{}.onnx".format(seed))
        export_mobilenet("mobilenet_v3_small", "random", path, seed=seed, log=quiet)
        paths.append(path)
    return paths
