"""Hostile input and faults (issue 10), each through the real CLI or the real service process.

The promise (README): bad input gets one line naming the file or key, exit 2, no traceback, never a
half-written file, and nothing the user had is lost. HOSTILE_* lists are the inputs tried.
"""

import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
import service_helpers as sh
import yaml

from conftest import REPO, assert_refused, edge_here, run_edge, write_video


def nested(depth):
    return "[" * depth + "]" * depth


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    "{0}: &{0} [*{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}]\n".format(chr(ord("b") + i), chr(ord("a") + i))
    for i in range(8))

# (config text or bytes, extra flags, what the one line must name)
HOSTILE_CONFIGS = [
    (b"runtime:\n  budget_ms: 30 \xff\xfe\n", [], "not UTF-8"),
    ("runtime: 5\n", ["--budget-ms", "20"], "'runtime' must be a mapping"),
    ("service:\n  metrics: 7\n", [], "'service.metrics' must be a mapping"),
    ("model: [1]\n", ["--model", "x.onnx"], "'model' must be a mapping"),
    (nested(50000), [], "nested too deeply"),
    ("runtime:\n  budget_ms: " + "9" * 400 + "\n", [], "'runtime.budget_ms' must be a finite number"),
    ("runtime:\n  latency_window: " + "9" * 400 + "\n", [], "'runtime.latency_window' must be between"),
    ("runtime:\n  budget_ms: .inf\nservice:\n  metrics:\n    enabled: true\n", [], "'runtime.budget_ms' must be a"),
    ("runtime:\n  budget_ms: .nan\n", [], "'runtime.budget_ms' must be a finite number"),
    ("source:\n  fps: -.inf\n", [], "'source.fps' must be a finite number"),
    ("preprocess:\n  mean: [.nan, 0.456, 0.406]\n", [], "'preprocess.mean[0]' must be a finite number"),
    ("preprocess:\n  std: [0.2, 0.2, 1.0e-300]\n", [], "'preprocess.std' must be between 0.001 and 1"),
    ("preprocess:\n  mean: [-5, 0.4, 0.4]\n", [], "'preprocess.mean' must be between 0.0 and 1"),
    ("build:\n  gate:\n    max_top1_drop_pp: .nan\n", [], "'build.gate.max_top1_drop_pp' must be a finite"),
    ("build:\n  gate:\n    max_top1_drop_pp: 1000\n", [], "'build.gate.max_top1_drop_pp' must be between"),
    ("runtime:\n  latency_window: 1000000000000\n", [], "'runtime.latency_window' must be between"),
    ("preprocess:\n  resize: 100000\n  crop: 100000\n", [], "'preprocess.resize' must be between"),
    ("source:\n  fps: 1.0e+9\n", [], "'source.fps' must be between"),
    ("source:\n  width: 1000000\n", [], "'source.width' must be between"),
    ("service:\n  telemetry:\n    interval_s: 1.0e-9\n", [], "'service.telemetry.interval_s' must be between"),
    ("runtime:\n  top_k: 100000000\n", [], "'runtime.top_k' must be between"),
    ("backend:\n  intra_op_threads: 1000000\n", [], "'backend.intra_op_threads' must be between"),
    ("build:\n  workspace_mb: 99999999999\n", [], "'build.workspace_mb' must be between"),
    (BOMB + "source:\n  uri: *i\n", [], "alias bomb"),
    ("source:\n  uri: [" + ", ".join(["x" * 1000] * 1000) + "]\n", [], "'source.uri' must be a string"),
    ("runtime:\n  ? " + "k" * 5000 + "\n  : 1\n", [], "unknown key 'runtime.kkkk"),
    ("# padding\n" * 200000, [], "cannot read config file: larger than 1 MB"),
    ("[1, 2]\n", [], "top level must be a mapping"),
]


@pytest.mark.parametrize("text,flags,expected", HOSTILE_CONFIGS,
                         ids=["config{}".format(i) for i in range(len(HOSTILE_CONFIGS))])
def test_hostile_config_is_one_line_exit_2(tmp_path, text, flags, expected):
    path = tmp_path / "bad.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    assert_refused(edge_here("run", "--config", path, "--model", tmp_path / "missing.onnx", *flags), path, expected)


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_hostile_config_flag_is_one_line_naming_the_flag(tmp_path, value):
    """A flag's value is checked as the file's value is, and the line names the flag the user typed."""
    says = "must be between" if value == "-1" else "must be a finite number"
    assert_refused(edge_here("run", "--model", tmp_path / "missing.onnx", "--budget-ms", value),
                   "error: --budget-ms: 'runtime.budget_ms' " + says)


def test_empty_section_with_a_flag_is_not_a_crash(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("runtime:\nsource:\n", encoding="utf-8")
    proc = edge_here("run", "--config", path, "--budget-ms", "20", "--model", tmp_path / "missing.onnx")
    assert_refused(proc, tmp_path / "missing.onnx")  # the config was accepted; the model is what is missing


# --- models that do not fit, unreadable sidecars and labels ----------------------------------------------

def tiny_onnx(path, side=224, classes=1000, labels=None):
    """A fixed-shape 1x3xSxS -> 1xN classifier (mean over the image, then a matrix), with labels beside it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((3, classes), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input"], ["m"], axes=[2, 3], keepdims=0),
         helper.make_node("MatMul", ["m", "w"], ["logits"])],
        "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    count = classes if labels is None else labels
    (path.parent / (path.stem + ".labels.txt")).write_text("".join("c{}\n".format(i) for i in range(count)),
                                                           encoding="utf-8")
    return path


def refused_run(model, *extra):
    """`edge run` on a model refused at load (in this process: conftest.edge_here)."""
    return edge_here("run", "--model", model, "--source", "synthetic", "--backend", "onnxruntime", "--preprocess",
                     "cpu", *extra)


HOSTILE_MODELS = [  # (input side, output classes, label lines, the file the line names, what it says)
    (320, 1000, 1000, "m.onnx", "the model takes input 1x3x320x320"),
    (224, 10, 1000, "m.labels.txt", "1000 labels, but the model"),
    (224, 1000, 10, "m.labels.txt", "10 labels, but the model"),
]


@pytest.mark.parametrize("side,classes,labels,named,says", HOSTILE_MODELS)
def test_a_model_that_does_not_fit_is_refused_at_load(tmp_path, side, classes, labels, named, says):
    model = tiny_onnx(tmp_path / "m.onnx", side, classes, labels)
    cfg = tmp_path / "c.yaml"
    sh.write_config(cfg, {"runtime": {"frames": 5, "warmup": 0}})
    proc = refused_run(model, "--config", cfg)
    assert_refused(proc, tmp_path / named, says)


HOSTILE_SIDECARS = [  # what is written to <model>.json / <model>.labels.txt, and what the line says
    ("m.json", nested(100000).encode(), "nested too deeply"),
    ("m.json", b'{"trained": tru\xff}', "not UTF-8"),
    ("m.json", b"x" * (65 << 20), "larger than 64 MB"),
    ("m.labels.txt", b"tench\n\xff\xfegoldfish\n", "not UTF-8"),
]


@pytest.mark.parametrize("name,content,says", HOSTILE_SIDECARS, ids=["sidecar{}".format(i) for i in range(4)])
def test_unreadable_sidecar_or_labels_is_one_line(small_model, tmp_path, name, content, says):
    model = sh.copy_model(small_model, tmp_path, "m")
    if len(content) > 1 << 20:
        with open(str(tmp_path / name), "wb") as fh:  # sparse: the size is what is refused
            fh.truncate(len(content))
    else:
        (tmp_path / name).write_bytes(content)
    assert_refused(refused_run(model, "--budget-ms", "1000"), tmp_path / name, says)


# --- round 4: outputs that are not one finite float score per label, a full disk, odd files -----------------

def graph_model(path, nodes, outputs, initializers=(), labels=10, side=224):
    """An ONNX model of `nodes` on a 1x3xSxS float input named "input", its `outputs` ((name, elem type, shape)),
    with `labels` label lines beside it."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info(
        "input", onnx.TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor_value_info(n, t, shape) for n, t, shape in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    (path.parent / (path.stem + ".labels.txt")).write_text("".join("c{}\n".format(i) for i in range(labels)),
                                                           encoding="utf-8")
    return path


def head(weight, then=()):
    """mean over the image -> MatMul by `weight` (3 x N) -> `then` nodes; the first output is "logits"."""
    from onnx import helper, numpy_helper

    last = "scores" if then else "logits"
    return ([helper.make_node("ReduceMean", ["input"], ["m"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["m", "w"], [last])] + list(then),
            [numpy_helper.from_array(np.asarray(weight, np.float32), "w")])


def test_a_model_with_a_nan_weight_is_refused_at_load_never_printed_as_nan(tmp_path):
    from onnx import TensorProto

    weight = np.ones((3, 10), np.float32)
    weight[1, 4] = np.nan
    nodes, inits = head(weight)
    model = graph_model(tmp_path / "nan.onnx", nodes, [("logits", TensorProto.FLOAT, [1, 10])], inits)
    image = tmp_path / "a.png"
    import cv2

    cv2.imwrite(str(image), np.full((64, 64, 3), 128, np.uint8))
    proc = run_edge("classify", image, "--model", model, "--json")
    assert_refused(proc, str(model), "non-finite output")
    assert proc.stdout == ""
    assert_refused(refused_run(model, "--budget-ms", "1000"), str(model), "non-finite output")


def test_non_finite_outputs_on_real_frames_are_failed_frames_up_to_the_limit(tmp_path, video_file):
    """sqrt of the normalised image: 0 on the blank input load proves, NaN on any darker-than-mean pixel."""
    from onnx import TensorProto, helper

    nodes, inits = head(np.ones((3, 3), np.float32))
    nodes = [helper.make_node("Sqrt", ["input"], ["root"])] + nodes
    nodes[1].input[0] = "root"
    model = graph_model(tmp_path / "sqrt.onnx", nodes, [("logits", TensorProto.FLOAT, [1, 3])], inits, labels=3)
    import cv2

    dark = tmp_path / "dark.png"
    cv2.imwrite(str(dark), np.zeros((64, 64, 3), np.uint8))
    proc = run_edge("classify", dark, "--model", model, "--json")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "failed {}: non-finite model output".format(dark) in proc.stderr
    cfg = tmp_path / "c.yaml"
    sh.write_config(cfg, {"runtime": {"max_consecutive_errors": 3, "warmup": 0}, "backend": sh.QUIET_ORT})
    proc = run_edge("run", "--config", cfg, "--model", model, "--source", video_file, "--backend", "onnxruntime",
                    "--preprocess", "cpu")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    errors = [line for line in lines if line["event"] == "frame_error"]
    assert len(errors) >= 3 and "non-finite model output" in errors[0]["error"]
    assert "4 consecutive frames failed" in proc.stderr.strip().splitlines()[-1]


def test_outputs_that_are_not_one_score_per_label_are_refused_at_load(tmp_path):
    from onnx import TensorProto, helper

    cases = []
    nodes, inits = head(np.ones((3, 1000), np.float32), [helper.make_node("Concat", ["scores", "scores"], ["logits"],
                                                                            axis=0)])
    cases.append((graph_model(tmp_path / "two.onnx", nodes, [("logits", TensorProto.FLOAT, [2, 1000])], inits,
                              labels=1000), "gives 2000 scores"))
    nodes, inits = head(np.ones((3, 1000), np.float32), [helper.make_node(
        "Reshape", ["scores", "shape"], ["logits"])])
    inits.append(__import__("onnx").numpy_helper.from_array(np.array([1, 2, 500], np.int64), "shape"))
    cases.append((graph_model(tmp_path / "split.onnx", nodes, [("logits", TensorProto.FLOAT, [1, 2, 500])], inits,
                              labels=500), "gives 1000 scores"))
    nodes, inits = head(np.ones((3, 10), np.float32), [helper.make_node("ArgMax", ["scores"], ["logits"], axis=1),
                                                       helper.make_node("Identity", ["scores"], ["probs"])])
    cases.append((graph_model(tmp_path / "argmax.onnx", nodes, [("logits", TensorProto.INT64, [1, 1]),
                                                                ("probs", TensorProto.FLOAT, [1, 10])], inits),
                  "first output is int64"))
    for model, says in cases:
        assert_refused(refused_run(model, "--budget-ms", "1000"), model.stem, says)


def test_a_model_that_ends_in_softmax_is_not_given_softmax_again(tmp_path):
    from onnx import TensorProto, helper

    weight = np.linspace(-3, 3, 30, dtype=np.float32).reshape(3, 10)
    nodes, inits = head(weight, [helper.make_node("Softmax", ["scores"], ["logits"], axis=1)])
    model = graph_model(tmp_path / "soft.onnx", nodes, [("logits", TensorProto.FLOAT, [1, 10])], inits)
    import cv2
    import onnxruntime as ort

    from edge.config import PreprocessConfig
    from edge.infer.preprocess import CpuPreprocessor

    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8))
    proc = run_edge("classify", image, "--model", model, "--json", "--top-k", "1")
    assert proc.returncode == 0, proc.stderr
    probs = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"input": CpuPreprocessor(PreprocessConfig())(cv2.imread(str(image)))})[0][0]
    top = json.loads(proc.stdout)["top"][0]
    assert top["index"] == int(np.argmax(probs)) and top["score"] == round(float(probs.max()), 4)
    assert top["score"] > 1.5 / 10  # softmax of probabilities would squeeze it towards 1/10


def test_a_fifo_or_a_device_is_named_as_not_a_regular_file(small_model, tmp_path):
    fifo = tmp_path / "camera.fifo"
    os.mkfifo(str(fifo))
    assert_refused(edge_here("run", "--model", small_model, "--source", fifo), str(fifo), "not a regular file")
    assert_refused(refused_run("/dev/zero"), "/dev/zero", "not a regular file")


def test_a_label_longer_than_a_class_name_is_refused_with_its_line(small_model, tmp_path):
    model = sh.copy_model(small_model, tmp_path, "m")
    os.unlink(str(tmp_path / "m.json"))  # the labels are the user's own
    labels = ["c{}".format(i) for i in range(1000)]
    labels[7] = "x" * (5 << 20)
    (tmp_path / "m.labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    assert_refused(refused_run(model, "--budget-ms", "1000"), "m.labels.txt", "line 8", "at most 256")


# --- edge check: output paths, --compare, sizes -------------------------------------------------------------

# Nothing here is about ORT threading or frame size: ORT runs one thread that does not spin (QUIET_ORT) and synthetic
# frames are small (1280x720 ones cost their making and resizing)
QUIET = {"backend": sh.QUIET_ORT, "source": {"width": 96, "height": 72}}


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    return sh.write_config(tmp_path_factory.mktemp("quiet") / "quiet.yaml", QUIET)


def check(model, config, *args, run=run_edge):
    return run("check", "--config", config, "--model", model, "--source", "synthetic", "--backend", "onnxruntime",
               "--preprocess", "cpu", "--warmup", "0", "--budget-ms", "1000", *args)


def test_check_output_paths_are_checked_before_running(small_model, quiet, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n", encoding="utf-8")
    os.symlink(str(victim), str(tmp_path / "link.json"))
    (tmp_path / "adir").mkdir()
    cases = [("--json", "/dev/full", "a device"), ("--json", tmp_path / "link.json", "a symlink"),
             ("--json", tmp_path / "adir", "a folder"), ("--plot", "/dev/null", "a device"),
             ("--plot", tmp_path / "victim.txt" / "x.png", "cannot write the figure")]
    for flag, path, says in cases:
        other = "--plot" if flag == "--json" else "--json"
        proc = check(small_model, quiet, "--frames", "3", flag, path, other, "", run=edge_here)
        line = assert_refused(proc, path, says)
        assert "timed" not in proc.stdout, line  # refused before any frame ran
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert victim.read_text(encoding="utf-8") == "precious\n" and os.listdir(str(tmp_path / "adir")) == []
    assert_refused(check(small_model, quiet, "--frames", "100000000000", "--json", "", "--plot", "", run=edge_here),
                   "--frames")
    assert_refused(check(small_model, quiet, "--regression-pct", "nan", "--json", "", "--plot", "", run=edge_here),
                   "--regression-pct")


def test_check_writes_through_no_planted_temp_file_and_reads_hostile_reports(small_model, quiet, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root-only\n", encoding="utf-8")
    os.chmod(str(victim), 0o600)
    report, figure = tmp_path / "report.json", tmp_path / "report.png"
    for planted in (str(report) + ".tmp", str(figure) + ".tmp"):  # the old fixed temp names
        os.symlink(str(victim), planted)
    deep, huge = tmp_path / "deep.json", tmp_path / "huge.json"
    deep.write_text(nested(100000), encoding="utf-8")
    assert_refused(check(small_model, quiet, "--compare", deep, "--json", report, "--plot", ""), deep,
                   "nested too deeply")
    assert not report.exists()
    big = "1" + "0" * 400
    huge.write_text('{"schema_version": 1, "stages_ms": {"end_to_end": {"p50": %s, "p99": %s}, '
                    '"infer": {"p50": NaN, "p99": Infinity}}}' % (big, big), encoding="utf-8")
    proc = check(small_model, quiet, "--frames", "5", "--json", report, "--plot", figure, "--compare", huge)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert json.loads(report.read_text(encoding="utf-8"))["frames"] == 5 and figure.read_bytes()[:4] == b"\x89PNG"
    assert victim.read_text(encoding="utf-8") == "root-only\n" and stat.S_IMODE(os.stat(str(victim)).st_mode) == 0o600
    leftovers = [n for n in os.listdir(str(tmp_path)) if n.endswith(".tmp") and not os.path.islink(
        str(tmp_path / n))]
    assert leftovers == []


# --- edge calibrate import: never delete what it did not write; odd files -----------------------------------

def photos(folder, count=2):
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        cv2.imwrite(str(folder / "p{}.png".format(i)), rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    return folder


def tree(root):
    return sorted(os.path.relpath(os.path.join(d, n), str(root)) for d, _, files in os.walk(str(root)) for n in files)


def test_calibrate_import_replaces_only_a_set_it_wrote(tmp_path):
    src = photos(tmp_path / "photos")
    mydocs = tmp_path / "mydocs"
    mydocs.mkdir()
    (mydocs / "thesis.txt").write_text("years of work\n", encoding="utf-8")
    afile = tmp_path / "afile"
    afile.write_text("x", encoding="utf-8")
    for out, says in ((mydocs, "no manifest.json in it"), (tmp_path, "must not contain"),
                      (src, "must not contain"), (src / "sub", "must not contain"), (afile, "not a folder")):
        before = tree(tmp_path)
        assert_refused(edge_here("calibrate", "import", src, out, "--min-images", "1"), out, says)
        assert tree(tmp_path) == before and (mydocs / "thesis.txt").read_text(encoding="utf-8") == "years of work\n"
    out = tmp_path / "set"
    assert edge_here("calibrate", "import", src, out, "--min-images", "1").returncode == 0
    assert edge_here("calibrate", "import", src, out, "--min-images", "1").returncode == 0  # its own set: replaced
    (out / "notes.txt").write_text("mine\n", encoding="utf-8")  # a user file dropped into the set is not lost either
    assert_refused(edge_here("calibrate", "import", src, out, "--min-images", "1"), out, "notes.txt")
    (out / "manifest.json").write_text(nested(100000), encoding="utf-8")
    assert_refused(edge_here("calibrate", "import", src, out, "--min-images", "1"), out, "not one this tool wrote")
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine\n"


def png_header(width, height):
    """A PNG that claims width x height (the IDAT is a stub): the pixel limit must act on the header."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + chunk(b"IEND", b""))


HOSTILE_FILES = [  # name in the import folder -> the reason it is skipped with
    ("fifo.jpg", "FIFO"), ("zero.jpg", "device"), ("loop.jpg", "symlink loop"), ("dangling.jpg", "dangling link"),
    ("bomb.png", "more than 100 megapixels"), ("huge.jpg", "larger than 256 MB"), ("empty.jpg", "zero-byte"),
    ("notes.txt", "not an image"),
]


def test_calibrate_import_skips_and_names_odd_files(tmp_path):
    src = photos(tmp_path / "src")
    os.mkfifo(str(src / "fifo.jpg"))
    os.symlink("/dev/zero", str(src / "zero.jpg"))
    os.symlink("loop.jpg", str(src / "loop.jpg"))
    os.symlink(str(tmp_path / "gone.jpg"), str(src / "dangling.jpg"))
    (src / "bomb.png").write_bytes(png_header(40000, 40000))
    with open(str(src / "huge.jpg"), "wb") as fh:
        fh.truncate(300 << 20)  # sparse
    (src / "empty.jpg").write_bytes(b"")
    (src / "notes.txt").write_text("hello\n", encoding="utf-8")
    out = tmp_path / "set"
    proc = run_edge("calibrate", "import", src, out, "--min-images", "1", timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    skipped = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["skipped"]
    for name, reason in HOSTILE_FILES:
        assert any(reason in why and name in names for why, names in skipped.items()), (name, skipped)
    assert sorted(os.listdir(str(out))) == ["manifest.json", "p0.png", "p1.png"]
    assert not [n for n in os.listdir(str(tmp_path)) if n.startswith(".")]  # no temp folder left


# --- the running service: model file overwritten or removed, metrics host ------------------------------------

def start_run(config):
    return subprocess.Popen([sys.executable, "-m", "edge", "run", "--config", str(config)], cwd=REPO,
                            encoding="utf-8", errors="replace",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def service_yaml(path, model, **extra):
    data = {"model": {"path": str(model)}, "backend": dict(sh.QUIET_ORT, kind="onnxruntime"),
            "preprocess": {"device": "cpu"},
            "source": {"uri": "synthetic", "width": 96, "height": 72, "fps": 50},
            "runtime": {"report_every": 10, "warmup": 2}, "service": {"telemetry": {"enabled": False}}}
    data.update(extra)
    return sh.write_config(path, data)


def test_sighup_and_sigterm_after_the_served_model_is_overwritten_or_removed(small_model, tmp_path):
    model = sh.copy_model(small_model, tmp_path, "m")
    proc = start_run(service_yaml(tmp_path / "c.yaml", model))
    try:
        out = sh.JsonLines(proc)
        out.wait_for("summary")
        with open(model, "r+b") as fh:  # overwritten in place: the running session never notices
            fh.write(b"\0garbage" * 64)
        proc.send_signal(signal.SIGHUP)
        first = out.wait_for("reload_failed")
        assert first["still_serving"] == model
        os.remove(model)
        proc.send_signal(signal.SIGHUP)
        out.wait_for("reload_failed")  # the next one: for the removed file
        frames = max(r["frames"] for r in out.records if r["event"] == "summary")
        out.wait_for(lambda r: r["event"] == "summary" and r["frames"] > frames)  # still serving
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        out.thread.join(timeout=5)
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr[-2000:]
    report = out.records[-1]
    assert report["event"] == "report" and report["reloads"]["failed"] == 2


def _ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host,url_host", [("0.0.0.0", "0.0.0.0"), ("", "0.0.0.0"), ("::", "[::]")])
def test_metrics_on_all_interfaces_warns_and_logs_a_well_formed_url(small_model, tmp_path, host, url_host):
    if ":" in host and not _ipv6_loopback():
        pytest.skip("no IPv6 here")
    pytest.importorskip("prometheus_client")
    cfg = service_yaml(tmp_path / "c.yaml", small_model,
                       service={"telemetry": {"enabled": False}, "metrics": {"enabled": True, "host": host,
                                                                           "port": sh.free_port()}})
    data = yaml.safe_load(open(cfg, encoding="utf-8"))
    data["runtime"]["frames"] = 3
    sh.write_config(cfg, data)
    proc = run_edge("run", "--config", cfg, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    records = sh.json_lines(proc.stdout)
    start = next(r for r in records if r["event"] == "start")
    assert start["metrics"].startswith("http://{}:".format(url_host)) and start["metrics"].endswith("/metrics")
    warning = next(r for r in records if r["event"] == "metrics_exposed")
    assert warning["level"] == "warning" and "beyond this machine" in warning["note"]


# --- edge demo: dead and ending sources, hostile HTTP clients -----------------------------------------------

def test_demo_on_a_dead_source_is_one_line_exit_2(small_model, tmp_path):
    cfg = sh.write_config(tmp_path / "c.yaml", {"source": {"start_timeout_s": 1.0}})
    proc = run_edge("demo", "--headless", "--port", "0", "--config", cfg, "--model", small_model, "--source",
                    "/dev/video99", "--backend", "onnxruntime", "--preprocess", "cpu", timeout=60)
    assert_refused(proc, "/dev/video99")


def test_demo_on_a_one_frame_video_ends_cleanly(small_model, tmp_path):
    clip = tmp_path / "one.avi"
    write_video(clip, frames=1)
    cfg = tmp_path / "c.yaml"
    sh.write_config(cfg, {"source": {"loop": False}})
    proc = run_edge("demo", "--headless", "--port", "0", "--config", cfg, "--model", small_model, "--source", clip,
                    "--backend", "onnxruntime", "--preprocess", "cpu", timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert [r for r in sh.json_lines(proc.stdout) if r["event"] == "report"][-1]["ended_by"] == "end of source"


def read_all(sock):
    """Everything until the server closes the connection (None if it does not within the socket's timeout)."""
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except socket.timeout:
        return None
    except OSError:
        return data


def test_demo_http_server_survives_rude_clients(small_model, tmp_path):
    # the frame loop runs all the while the idle clients time out (seconds): a few frames a second are a stream
    config = sh.write_config(tmp_path / "c.yaml", dict(QUIET, source=dict(QUIET["source"], fps=5)))
    port = sh.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "edge", "demo", "--headless", "--port", str(port), "--config",
                             config, "--model", small_model, "--source", "synthetic", "--backend", "onnxruntime",
                             "--preprocess", "cpu"],
                            cwd=REPO,
                            encoding="utf-8", errors="replace", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    idle = []
    try:
        out = sh.JsonLines(proc)
        out.wait_for("serving", timeout=60)
        for i in range(60):  # leave early: mid-stream, or before the answer is written
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall("GET {} HTTP/1.1\r\nHost: x\r\n\r\n".format(("/stream.mjpg", "/frame.jpg", "/")[i % 3])
                      .encode("ascii"))
            if i % 3 == 0:
                s.recv(100)
            s.close()
        for _ in range(40):  # slowloris: connect, send half a request line, never finish
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /stats")
            idle.append(s)
        refused_answer = socket.create_connection(("127.0.0.1", port), timeout=5)
        refused_answer.sendall(b"GET /stats.json HTTP/1.0\r\n\r\n")
        assert refused_answer.recv(100).startswith(b"HTTP/1.0 503")
        for s in idle:  # refused at once (503), or dropped CLIENT_TIMEOUT_S later: each one is closed
            s.settimeout(20)
            assert read_all(s) is not None
        deadline = time.monotonic() + 15
        while True:  # and serves again, once the handler threads of the dropped clients have ended
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /stats.json HTTP/1.0\r\n\r\n")
                body = read_all(s)
            if body.startswith(b"HTTP/1.0 200") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert body.startswith(b"HTTP/1.0 200"), body
        stats = json.loads(body.split(b"\r\n\r\n", 1)[1])
        assert stats["clients_refused"] >= 1
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        for s in idle:
            s.close()
        proc.kill()
    stderr = proc.stderr.read()
    assert proc.returncode == 0 and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr[-3000:]
    about_clients = [ln for ln in stderr.splitlines() if "client" in ln or "Error" in ln]
    assert len(about_clients) == 1 and "refusing more" in about_clients[0], stderr  # the cap, said once


def test_every_writer_goes_through_atomic_write():
    """The class, not the cases: no module writes a file next to its target by a fixed name any more."""
    modules = [os.path.relpath(os.path.join(root, name), REPO) for root, _, names in os.walk(os.path.join(REPO, "edge"))
               for name in names if name.endswith(".py") and name != "fileio.py"]
    assert len(modules) > 40
    for rel in modules:
        text = open(os.path.join(REPO, rel), encoding="utf-8").read()
        assert '+ ".tmp"' not in text and ".savefig(path" not in text, rel


def test_a_one_frame_video_with_loop_keeps_looping(small_model, quiet, tmp_path):
    clip = tmp_path / "one.avi"
    write_video(clip, frames=1)
    proc = check(small_model, quiet, "--source", str(clip), "--frames", "12", "--warmup", "2", "--json", "",
                 "--plot", "")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "12 frames after 2 warm-up" in proc.stdout, proc.stdout


def test_the_folder_source_skips_odd_files_and_names_them_when_none_is_left(small_model, quiet, tmp_path):
    folder = photos(tmp_path / "frames", count=1)
    os.mkfifo(str(folder / "fifo.jpg"))  # would block a plain open() forever
    os.symlink(str(tmp_path / "gone.jpg"), str(folder / "dangling.jpg"))
    (folder / "bomb.png").write_bytes(png_header(20000, 20000))
    proc = check(small_model, quiet, "--source", str(folder), "--frames", "6", "--warmup", "1", "--json", "",
                 "--plot", "")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "6 frames after 1 warm-up" in proc.stdout, proc.stdout
    os.remove(str(folder / "p0.png"))
    line = assert_refused(check(small_model, quiet, "--source", str(folder), "--json", "", "--plot", ""), folder,
                          "no readable image")
    assert "fifo.jpg: not a regular file" in line and "more than 100 megapixels" in line, line
