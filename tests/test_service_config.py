"""The shipped service config (systemd/config.yaml) end to end: `edge build` with it installs exactly the file its
model.path names, and `edge run` with it serves what was built (issue 20 item 3). On this CPU machine the
artifact is the onnx-qdq format (.int8.onnx) instead of the device's .int8.engine; every other path is the
shipped one, moved under a temporary root."""

import json
import os

import service_helpers as sh
import yaml

from edge.config import load_config
from edge.model.plan import FORMATS, artifact_path, source_model

from conftest import REPO, run_edge

SHIPPED = os.path.join(REPO, "systemd", "config.yaml")
STATE = "/var/lib/jetson-edge"


def test_the_shipped_service_config_names_the_engine_a_build_installs():
    cfg = load_config(SHIPPED)
    b = cfg.build
    built = artifact_path(source_model(cfg.model.path), b.engines_dir, b.precision, FORMATS["tensorrt-engine"])
    assert built == cfg.model.path == STATE + "/engines/mobilenet_v3_large.int8.engine"
    for path in (b.engines_dir, b.calibration_dir, b.regression_dir):
        assert path.startswith(STATE + "/"), path  # the unit's StateDirectory, whatever the working folder


def test_build_and_run_with_the_shipped_service_config(tiny_classifiers, tmp_path):
    root = tmp_path / "root"
    text = open(SHIPPED,
                encoding="utf-8").read().replace(STATE, str(root) + STATE).replace(".int8.engine", ".int8.onnx")
    config = tmp_path / "etc" / "config.yaml"
    config.parent.mkdir()
    data = yaml.safe_load(text)
    data["service"]["metrics"]["port"] = sh.free_port()
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    cfg = load_config(str(config))
    engines = root / "var/lib/jetson-edge/engines"
    sh.copy_model(tiny_classifiers[0], engines, "mobilenet_v3_large")  # an FP32 export, as the install puts it
    # the shipped sets' first images: build.min_images for calibration, a few to judge
    for name, count, dest in (("default", cfg.build.min_images, cfg.build.calibration_dir),
                              ("regression", 8, cfg.build.regression_dir)):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        sh.first_images(os.path.join(REPO, "calibration", name), count, dest)
    # one calibration method: `auto` calibrates three times (tests/test_auto_method.py covers it)
    build = run_edge("build", "--config", config, "--method", "minmax", "--no-progress", timeout=600)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr
    assert "note: model.path" not in build.stdout  # the build installed what the config serves
    info = json.loads((engines / "mobilenet_v3_large.int8.json").read_text(encoding="utf-8"))
    assert info["artifact"] == os.path.basename(cfg.model.path) and info["format"] == "onnx-qdq"
    assert str(root) not in json.dumps(info)  # no absolute path recorded

    run = run_edge("run", "--config", config, "--source", "synthetic", "--frames", 20, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    start = next(r for r in sh.json_lines(run.stdout) if r.get("event") == "start")
    assert start["model"] == cfg.model.path and start["precision"] == "int8-qdq"
    assert start["sha256"] == info["sha256"]
    report = next(r for r in sh.json_lines(run.stdout) if r.get("event") == "report")
    assert report["frames"] == 20
