import os
import subprocess
import sys

import pytest

from edge.config import as_dict, load_config
from edge.errors import EdgeError

from conftest import REPO, run_edge

BAD_CONFIGS = [
    ("runtime:\n  budget_ms: 30\n  bugdet: 1\n", "unknown key 'runtime.bugdet'"),
    ("colour: red\n", "unknown key 'colour'"),
    ("runtime:\n  budget_ms: fast\n", "'runtime.budget_ms' must be a number"),
    ("runtime:\n  frames: 1.5\n", "'runtime.frames' must be an integer"),
    ("source:\n  loop: 1\n", "'source.loop' must be true or false"),
    ("runtime:\n  budget_ms: -5\n", "'runtime.budget_ms' must be between 0.001 and"),
    ("backend:\n  kind: tflite\n", "'backend.kind' must be one of auto|onnxruntime|tensorrt"),
    ("preprocess:\n  crop: 300\n", "'preprocess.crop' (300) must not exceed 'preprocess.resize' (256)"),
    ("preprocess:\n  mean: [0.5, 0.5]\n", "'preprocess.mean' must list 3 numbers"),
    ("build:\n  gate:\n    min_agreement: 2\n", "'build.gate.min_agreement' must be between 0.0 and 1.0"),
    ("service:\n  metrics:\n    port: 70000\n", "'service.metrics.port' must be between 1 and 65535"),
    ("runtime: [1, 2]\n", "'runtime' must be a mapping"),
    ("runtime:\n  budget_ms: [30\n", "not valid YAML"),
    ("- just\n- a list\n", "top level must be a mapping"),
]


@pytest.mark.parametrize("text,expected", BAD_CONFIGS)
def test_bad_config_is_one_line_naming_the_key(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(EdgeError) as err:
        load_config(str(path))
    assert expected in str(err.value)
    assert str(path) in str(err.value)
    assert err.value.exit_code == 2


def test_defaults_and_overrides():
    cfg = load_config(None, {"runtime.budget_ms": 20, "source.uri": "x.mp4"})
    assert cfg.runtime.budget_ms == 20.0 and isinstance(cfg.runtime.budget_ms, float)
    assert cfg.source.uri == "x.mp4"
    assert load_config(None).runtime.budget_ms == 30.0


def test_cli_bad_config_exits_2_without_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("runtime:\n  budget: 30\n")
    proc = run_edge("run", "--config", path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "unknown key 'runtime.budget'" in proc.stderr


def test_cli_missing_config_file(tmp_path):
    proc = run_edge("run", "--config", tmp_path / "nope.yaml")
    assert proc.returncode == 2
    assert "nope.yaml: config file not found" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("case,expected", [
    ("missing model", "model file not found"),
    ("missing video", "missing.mp4: video file or image folder not found"),
    ("unreadable video", "garbage.mp4: cannot open video file"),
    ("empty image folder", "image folder has no images"),
    ("unknown scheme", "unsupported scheme"),
    ("model is not ONNX", "not a loadable ONNX model"),
])
def test_cli_bad_inputs_exit_2(tmp_path, small_model, case, expected):
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"this is not a video" * 10)
    empty = tmp_path / "empty"
    empty.mkdir()
    model, source = {
        "missing model": (tmp_path / "missing.onnx", "synthetic"),
        "missing video": (small_model, tmp_path / "missing.mp4"),
        "unreadable video": (small_model, garbage),
        "empty image folder": (small_model, empty),
        "unknown scheme": (small_model, "ftp://cam"),
        "model is not ONNX": (garbage, "synthetic"),
    }[case]
    proc = run_edge("run", "--backend", "onnxruntime", "--preprocess", "cpu", "--frames", 1,
                    "--model", model, "--source", source)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_optional_dependency_names_the_extra(small_model):
    code = ("import sys; sys.modules['onnxruntime'] = None; from edge.commands.cli import main; "
            "sys.exit(main(['run', '--model', {!r}, '--backend', 'onnxruntime', '--preprocess', 'cpu']))".format(
                small_model))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "missing dependency 'onnxruntime'" in proc.stderr and "jetson-edge[cpu]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_documented_example_is_complete_and_matches_the_defaults():
    example = load_config(os.path.join(REPO, "configs", "example.yaml"))
    assert as_dict(example) == as_dict(load_config(None))
