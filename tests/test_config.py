import argparse
import os
import subprocess
import sys

import pytest

from edge.config import Config, as_dict, example_yaml, load_config
from edge.errors import EdgeError
from edge.fields import APPLY, add_flags, flag_values, leaves, lookup, reloaded
from edge.infer.stages import STAGE_KEYS
from edge.service.runtime import APPLIERS

from conftest import REPO, assert_refused, edge_here, run_edge

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
    # YAML hardening (issue 19.18): no silent last-wins, no YAML 1.1 base-60 or octal numbers
    ("runtime:\n  budget_ms: 30\n  budget_ms: 5\n", "duplicate key 'budget_ms' (line 3)"),
    ("runtime:\n  top_k: 3\nruntime:\n  frames: 5\n", "duplicate key 'runtime' (line 3)"),
    ("build:\n  gate:\n    min_agreement: 0.9\n    min_agreement: 0.1\n", "duplicate key 'min_agreement'"),
    ("runtime:\n  budget_ms: 1:30\n", "'runtime.budget_ms' must be a number, got '1:30'"),
    ("runtime:\n  frames: 1:30\n", "'runtime.frames' must be an integer, got '1:30'"),
    ("runtime:\n  warmup: 010\n", "'runtime.warmup' must be an integer, got '010'"),
    ("runtime:\n  frames: 0x10\n", "'runtime.frames' must be an integer, got '0x10'"),
    ("runtime:\n  frames: 1_000\n", "'runtime.frames' must be an integer, got '1_000'"),
    ("service:\n  telemetry:\n    interval_s: 1e-9\n", "'service.telemetry.interval_s' must be between"),
    # every string field: no control characters (they reach logs and terminals)
    ("model:\n  path: \"m\\0.onnx\"\n", "'model.path' must not contain control characters"),
    ("build:\n  engines_dir: \"e\\e[31m\"\n", "'build.engines_dir' must not contain control characters"),
    ("source:\n  uri: \"rtsp://h/x latency=0 ! fakesink\"\n", "'source.uri': not a well-formed rtsp:// URI"),
    # a camera's key that is no name (issue 39.4): its camera and the key, not a TypeError from dict(**camera)
    ("sources:\n  - {name: a}\n  - {name: b, 1: x}\n", "'sources[1]' has a key that is not a name: 1"),
    ("sources:\n  - null: x\n", "'sources[0]' has a key that is not a name: null"),
    # one device, stream or file is one camera (/dev/video0 and v4l2://0 are the same device)
    ("sources:\n  - {name: a, uri: \"csi://0\"}\n  - {name: b, uri: \"csi://0\"}\n",
     "'sources[1].uri' 'csi://0' is also 'sources[0].uri'"),
    ("sources:\n  - {name: a, uri: /dev/video0}\n  - {name: b, uri: \"v4l2://1\"}\n  - {name: c, uri: \"v4l2://0\"}\n",
     "'sources[2].uri' 'v4l2://0' is also 'sources[0].uri'"),
    ("sources:\n  - {name: a, uri: clip.mp4}\n  - {name: b, uri: ./clip.mp4}\n", "'sources[1].uri'"),
    ("sources:\n  - {name: a, uri: \"rtsp://u:pw@cam/s\"}\n  - {name: b, uri: \"rtsp://u:pw@cam/s\"}\n",
     "'sources[1].uri' 'rtsp://***@cam/s'"),
]

GOOD_NUMBERS = [("service:\n  telemetry:\n    interval_s: 1e-1\n", "service.telemetry.interval_s", 0.1),
                ("runtime:\n  budget_ms: 2E+1\n", "runtime.budget_ms", 20.0),
                ("runtime:\n  budget_ms: 25\n", "runtime.budget_ms", 25.0),
                ("runtime:\n  budget_ms: -0.5e1\n", None, "must be between"),
                ("runtime:\n  frames: 0\n", "runtime.frames", 0),
                ("runtime:\n  frames: +7\n", "runtime.frames", 7),
                ("source:\n  loop: no\n", "source.loop", False)]


@pytest.mark.parametrize("text,expected", BAD_CONFIGS)
def test_bad_config_is_one_line_naming_the_key(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(EdgeError) as err:
        load_config(str(path))
    assert expected in str(err.value)
    assert str(path) in str(err.value)
    assert err.value.exit_code == 2


@pytest.mark.parametrize("text, key, expected", GOOD_NUMBERS)
def test_numbers_read_as_yaml_1_2_writes_them(tmp_path, text, key, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    if key is None:
        with pytest.raises(EdgeError, match=expected):
            load_config(str(path))
        return
    value = lookup(load_config(str(path)), key)
    assert value == expected and type(value) is type(expected)


def test_defaults_and_overrides():
    cfg = load_config(None, {"runtime.budget_ms": 20, "source.uri": "x.mp4"})
    assert cfg.runtime.budget_ms == 20.0 and isinstance(cfg.runtime.budget_ms, float)
    assert cfg.source.uri == "x.mp4"
    assert load_config(None).runtime.budget_ms == 30.0


def test_cli_bad_config_exits_2_without_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("runtime:\n  budget: 30\n", encoding="utf-8")
    assert_refused(edge_here("run", "--config", path), "unknown key 'runtime.budget'")


def test_a_camera_key_that_is_no_name_is_one_line_exit_2(tmp_path):
    """Exit 2 is the unit's RestartPreventExitStatus: a traceback's exit 1 had systemd restart it every 5 s."""
    path = tmp_path / "keys.yaml"
    path.write_text("sources:\n  - {name: a}\n  - {name: b, 1: x}\n", encoding="utf-8")
    assert_refused(edge_here("run", "--config", path), str(path), "sources[1]", ": 1 ")


def test_synthetic_cameras_may_repeat(tmp_path):
    path = tmp_path / "synthetic.yaml"
    path.write_text("sources:\n  - {name: a}\n  - {name: b, uri: synthetic}\n", encoding="utf-8")
    assert [c.uri for c in load_config(str(path)).sources] == ["synthetic", "synthetic"]


@pytest.mark.parametrize("command", ["run", "check", "demo", "doctor"])
def test_source_flag_with_a_config_that_lists_cameras_is_refused(tmp_path, command):
    """`sources:` is what these commands serve; --source would have been ignored without a word."""
    path = tmp_path / "multi.yaml"
    path.write_text("sources:\n  - {name: a}\n  - {name: b}\n", encoding="utf-8")
    assert_refused(edge_here(command, "--config", path, "--source", "x.mp4"), "--source", str(path), "2 cameras")


def test_a_cameras_error_names_its_key_in_the_file(tmp_path, small_model):
    """The second camera's missing file is `sources[1].uri`, not `source.uri` (or a bare path)."""
    path = tmp_path / "cameras.yaml"
    path.write_text("sources:\n  - {name: a}\n  - {name: b, uri: %s}\n" % (tmp_path / "gone.mp4"), encoding="utf-8")
    assert_refused(edge_here("run", "--config", path, "--model", small_model, "--frames", 1),
                   "sources[1].uri", "gone.mp4: video file or image folder not found")
    assert load_config(str(path)).sources[1].key == "sources[1]" and "key" not in as_dict(load_config(str(path)))[
        "sources"][1]  # its place in the file is no YAML key


def test_cli_missing_config_file(tmp_path):
    assert_refused(edge_here("run", "--config", tmp_path / "nope.yaml"), "nope.yaml: config file not found")


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
    assert_refused(edge_here("run", "--backend", "onnxruntime", "--preprocess", "cpu", "--frames", 1,
                             "--model", model, "--source", source), expected)


def test_missing_optional_dependency_names_the_extra(small_model):
    code = ("import sys; sys.modules['onnxruntime'] = None; from edge.cli.main import main; "
            "sys.exit(main(['run', '--model', {!r}, '--backend', 'onnxruntime', '--preprocess', 'cpu']))".format(
                small_model))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          encoding="utf-8", errors="replace", timeout=60)
    assert_refused(proc, "missing dependency 'onnxruntime'", "jetson-edge[cpu]")


def test_documented_example_is_complete_and_matches_the_defaults():
    path = os.path.join(REPO, "configs", "example.yaml")
    with open(path, encoding="utf-8") as fh:
        assert fh.read() == example_yaml(), (
            "configs/example.yaml is generated from the declarations in edge/config.py; regenerate it with "
            ".venv/bin/python -c \"from edge.config import example_yaml; print(example_yaml(), end='')\" "
            "> configs/example.yaml")
    assert as_dict(load_config(path)) == as_dict(load_config(None))
    for dotted, f, _ in leaves(Config):  # every key documented, with its choices
        assert "\n{}{}: ".format("  " * dotted.count("."), dotted.rsplit(".", 1)[-1]) in example_yaml()
        assert all(str(c) in example_yaml() for c in f.metadata["choices"])


def test_each_declared_flag_overrides_its_key_with_the_declared_type_and_choices():
    """The flags are derived from the declarations: every command that has one takes the same values."""
    declared = {dotted: f for dotted, f, _ in leaves(Config) if f.metadata["flag"]}
    assert {"source.uri", "model.path", "runtime.budget_ms", "backend.kind", "preprocess.device",
            "build.precision", "build.method"} <= set(declared)
    parser = argparse.ArgumentParser()
    add_flags(parser, Config, *declared)
    for dotted, f in declared.items():
        value = f.metadata["choices"][-1] if f.metadata["choices"] else {int: "3", float: "3.5", str: "x"}[f.type]
        args = parser.parse_args([f.metadata["flag"], value])
        assert flag_values(args, Config) == {dotted: f.type(value)}
        if f.metadata["choices"]:
            with pytest.raises(SystemExit):
                parser.parse_args([f.metadata["flag"], "not-a-choice"])


@pytest.mark.parametrize("argv, says", [
    (["run", "--backend", "tflite"], "invalid choice: 'tflite'"),
    (["classify", "x.jpg", "--preprocess", "gpu"], "invalid choice: 'gpu'"),
    (["build", "--precision", "int4"], "invalid choice: 'int4'"),
    (["classify", "x.jpg", "--top-k", "0"], "'runtime.top_k' must be between 1 and 1000"),
    (["run", "--frames", "-1"], "'runtime.frames' must be between 0 and"),
])
def test_every_command_checks_a_flag_as_the_config_checks_its_key(argv, says):
    proc = run_edge(*argv)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_reload_applies_the_keys_declared_reloadable_and_names_the_rest():
    running = load_config(None)
    new = load_config(None, {"model.path": "b.onnx", "runtime.top_k": 3, "runtime.budget_ms": 20,
                             "source.uri": "clip.mp4", "service.metrics.port": 9200, "build.method": "entropy"})
    applied, restart = reloaded(running, new)
    assert applied.model.path == "b.onnx" and applied.runtime.top_k == 3
    assert applied.runtime.budget_ms == 30.0 and applied.source.uri == "synthetic"
    assert sorted(restart) == ["runtime.budget_ms", "service.metrics.port", "source.uri"]  # build.*: not served
    assert running.model.path != "b.onnx"  # the running config is never changed in place
    policies = {dotted: policy for dotted, _, policy in leaves(Config)}
    assert {k for k, p in policies.items() if p == APPLY} >= {"model.path", "preprocess.mean", "backend.kind",
                                                              "runtime.top_k", "runtime.max_consecutive_errors"}


def test_every_key_declared_reloadable_has_what_applies_it():
    """A reload=APPLY key is read by the stages a reload builds anew, or has an applier in the runtime: a key marked
    APPLY with neither would be reported applied while the running objects keep the old value."""
    apply_keys = [dotted for dotted, _, policy in leaves(Config) if policy == APPLY]
    by_stages = [k for k in apply_keys if k.startswith(STAGE_KEYS)]
    assert set(apply_keys) - set(by_stages) == set(APPLIERS), "APPLY keys without an applier"
    assert "runtime.top_k" in by_stages and "model.path" in by_stages
