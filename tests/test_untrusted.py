"""Untrusted text (issue 19 items 1, 2, 9, 10, 11, 18-20) through the commands: source URIs, credentials, error lines
and a model's own preprocessing constants. Each class is tested with several hostile inputs (the HOSTILE_* lists;
the modules' own: test_uri.py, test_errors.py, test_postprocess.py)."""

import json
import os
import signal
import subprocess
import sys

import pytest
from test_uri import HOSTILE_URIS, PASSWORD, TOKEN

from edge.errors import EdgeError

from conftest import assert_refused, edge_here, run_edge

# --- source URIs: parsed once, refused when not a well-formed URI of their kind ----------------------------


def test_the_injection_is_refused_by_every_command_before_anything_runs(small_model, tmp_path):
    injection = HOSTILE_URIS[0].replace("/tmp/pwn", str(tmp_path / "pwn"))
    for argv in (["run", "--model", small_model], ["check", "--json", "", "--plot", ""], ["doctor"],
                 ["calibrate", "capture", "set"], ["demo", "--headless"], ["rebuild", "--dry-run"]):
        assert_refused(edge_here(*argv, "--source", injection), "source.uri")
    assert not [name for name in os.listdir(str(tmp_path)) if name.startswith("pwn")]


# --- credentials: masked in every output --------------------------------------------------------------------

@pytest.mark.parametrize("password", ["S3cret PW", 'S3cret"PW', "S3cret'PW", "S3cret<PW", "S3cret\\PW",
                                      "S3cret/PW"])
def test_the_refusal_of_a_uri_never_prints_its_password(password):
    proc = edge_here("run", "--source", "rtsp://admin:{}@127.0.0.1/cam#{}".format(password, TOKEN))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "S3cret" not in proc.stdout + proc.stderr and TOKEN not in proc.stdout + proc.stderr, proc.stderr
    assert "process list (ps)" in proc.stderr  # and it says where the URI belongs instead


def test_a_password_uri_leaks_from_no_command_when_the_source_is_down(small_model, tmp_path):
    """The failure paths (the working ones: tests/test_gstreamer.py): every command, side by side."""
    uri = "rtsp://admin:{}@127.0.0.1:9/cam?token={}".format(PASSWORD, TOKEN)  # nothing listens on port 9
    config = tmp_path / "edge.yaml"
    config.write_text("source:\n  uri: '{}'\n  start_timeout_s: 2\nmodel:\n  path: {}\n".format(uri, small_model),
                      encoding="utf-8")
    commands = (["run"], ["check", "--json", "report.json", "--plot", ""], ["demo", "--headless", "--port", "0"],
                ["doctor"],
                ["calibrate", "capture", "set", "--capture-frames", "5", "--every", "1", "--min-images", "1"],
                ["rebuild", "--dry-run", "--no-reload"])
    procs = [subprocess.Popen([sys.executable, "-m", "edge"] + argv + ["--config", str(config)], cwd=str(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8", errors="replace")
             for argv in commands]
    for argv, proc in zip(commands, procs):
        head = []
        for line in proc.stdout:  # until the first fault is reported (or the command gives up)
            head.append(line)
            if '"source_fault"' in line:
                proc.send_signal(signal.SIGTERM)  # a frame loop: stopped, it reports
                break
        out, err = proc.communicate(timeout=120)
        out = "".join(head) + out
        assert "Traceback" not in err, (argv, err)
        assert PASSWORD not in out + err and TOKEN not in out + err, (argv, out, err)
        assert out + err, argv  # it said something (that could have leaked)
    written = [os.path.join(root, name) for root, _, names in os.walk(str(tmp_path)) for name in names]
    for path in written:
        if not path.endswith("edge.yaml"):
            with open(path, "rb") as fh:
                assert PASSWORD.encode() not in fh.read(), path


# --- error lines: one bounded, escaped line for anything -----------------------------------------------------

def test_a_huge_or_hostile_path_gives_one_bounded_escaped_line(tmp_path):
    long_arg = str(tmp_path) + ("/" + "d" * 199) * 500 + "/c.yaml"  # 100 KB: one argument can be at most 128 KB
    for path in (long_arg, str(tmp_path / "a\nb\x1b[31m.yaml"), str(tmp_path / "nul\x7f.yaml")):
        line = assert_refused(edge_here("run", "--config", path), "config file")
        assert "\x1b" not in line and "\x7f" not in line
    config = tmp_path / "huge.yaml"
    config.write_text("model:\n  path: " + "m/" * 450000 + "x.onnx\n", encoding="utf-8")  # a 900 KB path, in a config
    assert_refused(edge_here("run", "--config", str(config), "--backend", "onnxruntime"), "x.onnx")
    assert_refused(edge_here("run", "--config", str(tmp_path)), str(tmp_path), "folder")
    (tmp_path / "sub.yaml").mkdir()
    assert_refused(edge_here("check", "--config", str(tmp_path / "sub.yaml")), "sub.yaml")


def test_every_os_error_is_one_line_naming_the_file(small_model, tmp_path):
    """check's outputs are checked before the run; what can only fail at the write is still one line."""
    long_name = "r" * 250 + ".json"  # fits the folder, but not with atomic_write's temporary-name padding
    for args, names in ((["--json", str(tmp_path / long_name)], [long_name[:40]]),
                        (["--json", "/proc/version/x.json"], ["/proc/version/x.json"])):
        proc = run_edge("check", "--model", small_model, "--source", "synthetic", "--frames", "2", "--warmup", "0",
                        "--plot", "", "--budget-ms", "1000", *args)
        line = assert_refused(proc, *names)
        assert "timed" not in proc.stdout, line  # refused before the run


# --- labels and a model's preprocessing constants: the config's checks, naming file and key --------------

GOOD_PRE = {"resize": 256, "crop": 224, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
HOSTILE_PREPROCESS = [
    ({"resize": 1e21}, "'preprocess.resize' must be an integer"), ({"resize": True}, "'preprocess.resize' must be"),
    ({"resize": 10 ** 400}, "'preprocess.resize' must be between"), ({"resize": "256"}, "'preprocess.resize'"),
    ({"crop": 0}, "'preprocess.crop' must be between"), ({"crop": 300}, "must not exceed 'preprocess.resize'"),
    ({"mean": [1e308, 0.4, 0.4]}, "'preprocess.mean' must be between"), ({"mean": [0.4, 0.4]}, "list 3 numbers"),
    ({"std": [1e-320, 0.2, 0.2]}, "'preprocess.std' must be between"), ({"std": [True, 0.2, 0.2]}, "std[0]"),
    ({"mean": [float("nan"), 0.4, 0.4]}, "finite"), ({"std": "0.2"}, "must be a list"),
    ({"mean": None}, "'preprocess.mean' must be a list"), ({"resize": [256] * 100000}, "'preprocess.resize'"),
]


@pytest.mark.parametrize("change, says", HOSTILE_PREPROCESS)
def test_a_model_infos_preprocessing_gets_the_configs_checks(tmp_path, change, says):
    from edge.config import PreprocessConfig
    from edge.infer.preprocess import model_preprocess

    model = str(tmp_path / "m.onnx")
    with pytest.raises(EdgeError) as err:
        model_preprocess(PreprocessConfig(), {"preprocess": dict(GOOD_PRE, **change)}, model, "<defaults>")
    line = str(err.value)
    assert line.startswith(str(tmp_path / "m.json")) and says in line and len(line) < 300, line


def test_a_model_info_that_repeats_a_key_is_refused(small_model, tmp_path):
    from edge.inputs import load_json

    path = tmp_path / "m.json"
    path.write_text('{"trained": false, "preprocess": {"resize": 256, "resize": 1e21}}', encoding="utf-8")
    with pytest.raises(EdgeError, match="repeats the key \"resize\""):
        load_json(str(path), "model info")
    # what json alone would have used
    assert json.loads(path.read_text(encoding="utf-8"))["preprocess"]["resize"] == 1e21


def test_a_file_name_that_is_not_utf8_prints_escaped(small_model, tmp_path):
    import cv2
    import numpy as np

    folder = os.fsencode(str(tmp_path))
    ok, png = cv2.imencode(".png", np.zeros((32, 32, 3), np.uint8))
    with open(folder + b"/ph\xffoto.png", "wb") as fh:
        fh.write(png.tobytes())
    proc = run_edge("classify", str(tmp_path), "--model", small_model)  # the table names the file on stdout
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "ph\\udcffoto.png" in proc.stdout


# --- the daemon's metrics URL: one builder (issue 38.8) ------------------------------------------------------------
@pytest.mark.parametrize("host, client, shown", [
    ("", "http://127.0.0.1:9108/metrics", "http://0.0.0.0:9108/metrics"),
    ("0.0.0.0", "http://127.0.0.1:9108/metrics", "http://0.0.0.0:9108/metrics"),
    ("::", "http://[::1]:9108/metrics", "http://[::]:9108/metrics"),
    ("10.0.0.5", "http://10.0.0.5:9108/metrics", "http://10.0.0.5:9108/metrics"),
    ("fe80::1", "http://[fe80::1]:9108/metrics", "http://[fe80::1]:9108/metrics"),
])
def test_a_bind_to_every_interface_is_scraped_on_loopback(host, client, shown):
    from edge.uri import metrics_url

    assert metrics_url(host, 9108, local_client=True) == client
    assert metrics_url(host, 9108, local_client=False) == shown


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::"])
def test_the_bake_and_the_rebuild_scrape_loopback_whatever_the_bind(tmp_path, host):
    """`metrics.host: ""` was baked at http://:9108/metrics, which cannot be read: the release fell back."""
    import types

    from edge.cli.rebuild import metrics_url as rebuild_url
    from edge.config import load_config
    from edge.fleet.rollout import metrics_url as bake_url

    (tmp_path / "v1").mkdir()
    config = tmp_path / "v1" / "config.yaml"
    config.write_text(json.dumps({"service": {"metrics": {"enabled": True, "host": host, "port": 9200}}}),
                      encoding="utf-8")
    loopback = "http://{}:9200/metrics".format("[::1]" if host == "::" else "127.0.0.1")
    device = types.SimpleNamespace(release_dir=lambda release: str(tmp_path / release))
    assert bake_url(device, "v1") == rebuild_url(load_config(str(config))) == loopback


def test_one_module_writes_the_metrics_url():
    """edge.uri.metrics_url alone spells a /metrics URL: no second builder with its own idea of loopback."""
    import glob

    import edge

    def spells_one(path):
        with open(path, encoding="utf-8") as fh:
            return ':{}/metrics"' in fh.read()

    root = os.path.dirname(edge.__file__)
    writers = [os.path.relpath(path, root) for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
               if spells_one(path)]
    assert writers == ["uri.py"]
