"""The per-identity artifact cache (edge/build/engine_cache.py, `edge cache`): one real CPU build is
published, then fetched by a second "device" from a folder and over real HTTP; a miss, a corrupt entry and
another identity fall back to a local build (nothing installed)."""

import functools
import http.server
import os
import shutil
import threading

import pytest
import yaml

from edge.artifact import companions, read_model_info, sha256_file, verify
from edge.build import engine_cache
from edge.build.calibration import import_calibration_set
from edge.build.plan import check_inputs, expected_manifest
from edge.commands.cli import main as cli
from edge.config import load_config

from conftest import REPO, assert_refused, run_edge


def device(tmp_path, name, model, sets, precision="int8"):
    """A device's config: its own engines folder, the shared model and sets."""
    config = tmp_path / (name + ".yaml")
    config.write_text(yaml.safe_dump({
        "model": {"path": model}, "backend": {"kind": "onnxruntime"},
        "build": {"engines_dir": str(tmp_path / name / "engines"), "calibration_dir": sets[0],
                  "regression_dir": sets[1], "min_images": 1, "precision": precision, "method": "minmax"}}))
    return str(config)


def plan_of(config):
    return check_inputs(load_config(config), show_progress=False)


@pytest.fixture(scope="module")
def model(tiny_classifiers):
    """The FP32 export every device builds from (the network does not matter here)."""
    return tiny_classifiers[0]


@pytest.fixture(scope="module")
def canary(model, tmp_path_factory):
    """A canary that built (the real CPU build) and published its artifact into a folder cache."""
    tmp = tmp_path_factory.mktemp("cache")
    images = sorted(f for f in os.listdir(os.path.join(REPO, "calibration", "default")) if f.endswith(".jpg"))
    sets = []
    for name, chosen in (("cal", images[:3]), ("reg", images[3:6])):  # two sets, two sha256
        raw = tmp / ("raw-" + name)
        raw.mkdir()
        for image in chosen:
            shutil.copy(os.path.join(REPO, "calibration", "default", image), str(raw))
        sets.append(str(tmp / name))
        import_calibration_set(str(raw), sets[-1], 1, log=lambda *a: None)
    config = device(tmp, "canary", model, sets)
    assert cli(["build", "--config", config, "--no-progress"]) == 0
    cache = str(tmp / "shared")
    folder = engine_cache.publish(plan_of(config), cache, log=lambda *a: None)
    return tmp, sets, config, cache, folder


def test_publish_keys_the_artifact_by_its_identity(canary):
    tmp, sets, config, cache, folder = canary
    plan = plan_of(config)
    assert os.path.basename(folder) == engine_cache.identity(expected_manifest(plan))
    assert sorted(os.listdir(folder)) == sorted(os.path.basename(p) for p in companions(plan.artifact))
    assert sha256_file(os.path.join(folder, os.path.basename(plan.artifact))) == sha256_file(plan.artifact)
    assert [n for n in os.listdir(cache) if n.startswith(".")] == []  # no temporary folder left


def test_hit_from_a_folder_installs_the_verified_artifact(canary, tmp_path, model):
    _, sets, config, cache, _ = canary
    logged = []
    plan = plan_of(device(tmp_path, "jetson-07", model, sets))
    assert engine_cache.fetch(plan, cache, log=logged.append) is True
    assert "engine cache: hit" in logged[-1]
    verify(plan.artifact, expected_manifest(plan))
    assert read_model_info(plan.artifact)["built_at"] == read_model_info(plan_of(config).artifact)["built_at"]
    assert sorted(os.listdir(os.path.dirname(plan.artifact))) == sorted(
        os.path.basename(p) for p in companions(plan.artifact))  # the three files, no temporary left


def test_miss_and_another_identity_install_nothing(canary, tmp_path, model):
    _, sets, _, cache, _ = canary
    logged = []
    plan = plan_of(device(tmp_path, "empty", model, sets))
    assert engine_cache.fetch(plan, str(tmp_path / "no-cache"), log=logged.append) is False
    assert "engine cache: miss" in logged[-1] and not os.path.exists(plan.artifact)
    other = plan_of(device(tmp_path, "other", model, sets[::-1]))  # other calibration: other identity
    assert engine_cache.fetch(other, cache, log=logged.append) is False
    assert "miss" in logged[-1] and os.listdir(os.path.dirname(other.artifact)) == []


def test_corrupt_entry_is_refused_and_nothing_installed(canary, tmp_path, model):
    _, sets, config, cache, folder = canary
    broken = str(tmp_path / "broken")
    shutil.copytree(cache, broken)
    cached = os.path.join(broken, os.path.basename(folder), os.path.basename(plan_of(config).artifact))
    with open(cached, "r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    logged = []
    plan = plan_of(device(tmp_path, "jetson-08", model, sets))
    assert engine_cache.fetch(plan, broken, log=logged.append) is False
    assert "corrupt entry" in logged[-1] and "sha256" in logged[-1]
    assert os.listdir(os.path.dirname(plan.artifact)) == []


def test_hit_and_miss_over_http_and_the_cli_exit_codes(canary, tmp_path, model):
    _, sets, _, cache, _ = canary
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=cache)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:{}/".format(server.server_address[1])
        config = device(tmp_path, "jetson-09", model, sets)
        missed = run_edge("cache", "fetch", url, "--config", device(tmp_path, "x", model, sets[::-1]))
        assert missed.returncode == 1 and "engine cache: miss" in missed.stdout, missed.stdout + missed.stderr
        hit = run_edge("cache", "fetch", url, "--config", config)
        assert hit.returncode == 0 and "engine cache: hit" in hit.stdout, hit.stdout + hit.stderr
        verify(plan_of(config).artifact, expected_manifest(plan_of(config)))
        assert_refused(run_edge("cache", "publish", url, "--config", config), url, code=2)
    finally:
        server.shutdown()
        server.server_close()
