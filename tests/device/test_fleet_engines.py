"""On the device: a real TensorRT engine through the per-identity cache, and the container entrypoint swapping
back the engine kept in previous/ (a `helm rollback`) instead of building. `pytest -m jetson tests/device`."""

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from edge.store.artifact import check_engine, sha256_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.jetson, pytest.mark.tensorrt]


def edge(*args):
    proc = subprocess.run([sys.executable, "-m", "edge"] + [str(a) for a in args], capture_output=True,
                          encoding="utf-8", errors="replace",
                          cwd=REPO, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def config(tmp_path, name):
    path = tmp_path / (name + ".yaml")
    path.write_text(yaml.safe_dump({"model": {"path": str(tmp_path / name / "m.fp16.engine")},
                                    "build": {"engines_dir": str(tmp_path / name), "precision": "fp16"}}),
                                    encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def models(onnx_model, tmp_path_factory):
    """Two FP32 models under one file name (m.onnx): a release and the one before it."""
    tmp = tmp_path_factory.mktemp("models")
    pairs = []
    for release, seed in (("old", 1), ("new", 2)):
        folder = tmp / release
        folder.mkdir()
        if release == "old":
            for ext in (".onnx", ".labels.txt", ".json"):
                shutil.copy(onnx_model[:-5] + ext, str(folder / ("m" + ext)))
        else:
            pytest.importorskip("torch", reason="a second model is exported with torch")
            edge("export", "--arch", "mobilenet_v3_small", "--weights", "random", "--seed", seed,
                 "--out", folder / "m.onnx")
        pairs.append(str(folder / "m.onnx"))
    return pairs


def test_a_real_engine_through_the_shared_cache(gpu, models, tmp_path):
    canary = config(tmp_path, "canary")
    edge("build", "--engine", "--config", canary, "--model", models[0], "--no-progress")
    edge("cache", "publish", tmp_path / "shared", "--engine", "--config", canary, "--model", models[0])
    other = config(tmp_path, "other")
    fetched = edge("cache", "fetch", tmp_path / "shared", "--engine", "--config", other, "--model", models[0])
    assert "engine cache: hit" in fetched.stdout
    engine = str(tmp_path / "other" / "m.fp16.engine")
    check_engine(engine)  # what the TensorRT backend checks before it loads
    assert sha256_file(engine) == sha256_file(str(tmp_path / "canary" / "m.fp16.engine"))


def test_entrypoint_swaps_back_the_previous_engine_without_building(gpu, models, tmp_path):
    cfg = config(tmp_path, "node")
    for model in models:  # old, then new: previous/ keeps the old engine
        edge("build", "--engine", "--config", cfg, "--model", model, "--no-progress")
    new_sha = sha256_file(str(tmp_path / "node" / "m.fp16.engine"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    # records every call; runs the real edge except `run` (the daemon) and `build` (it must not happen)
    (bin_dir / "edge").write_text('#!/bin/sh\necho "$*" >> {}\ncase "$1" in run|build) exit 0;; esac\n'
                                  'exec {} -m edge "$@"\n'.format(calls, sys.executable), encoding="utf-8")
    (bin_dir / "edge").chmod(0o755)
    env = dict(os.environ, PATH="{}:{}".format(bin_dir, os.environ["PATH"]), EDGE_CONFIG=cfg,
               EDGE_SOURCE_MODEL=models[0], PYTHONPATH=REPO)
    proc = subprocess.run([os.path.join(REPO, "deploy", "container", "entrypoint.sh")], capture_output=True,
                          encoding="utf-8", errors="replace", env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "previous/ holds this model's engine" in proc.stdout
    assert [c.split()[0] for c in calls.read_text(encoding="utf-8").splitlines()] == ["rollback", "run"]
    assert sha256_file(str(tmp_path / "node" / "previous" / "m.fp16.engine")) == new_sha
