"""edge.model.user_model (`edge model add`): a user's own classifier gets its labels, preprocessing and provenance
recorded (a BGR or NHWC input adapted once) so that every command feeds it as it was trained; a bad value is one
line and writes nothing."""

import json
import os

import pytest
from test_model_info import colour_images, colour_model

from edge.store.model_info import read_model_info

from conftest import assert_refused, edge_here, run_edge


@pytest.mark.parametrize("layout,colour", [("nchw", "rgb"), ("nchw", "bgr"), ("nhwc", "rgb"), ("nhwc", "bgr")])
def test_model_add_records_what_the_model_was_trained_with_and_classify_feeds_it_so(tmp_path, layout, colour):
    model = colour_model(tmp_path / "shapes.onnx", layout=layout, colour=colour)
    labels = str(tmp_path / "shapes.labels.txt")
    assert edge_here("model", "add", model, "--labels", labels, "--layout", layout, "--colour", colour,
                     "--mean", "0,0,0", "--std", "1,1,1", "--expected-top1", "0.96",
                     "--weights", "colours v1").returncode == 0
    info = read_model_info(model)
    assert info["weights"] == "colours v1" and info["trained"] is True and info["expected_top1"] == 0.96
    assert info["preprocess"] == {"resize": 37, "crop": 32, "mean": [0, 0, 0], "std": [1, 1, 1]}
    assert info["input"]["shape"] == [1, 3, 32, 32] and info["labels"] == "shapes.labels.txt"
    assert info.get("trained_input") == (None if (layout, colour) == ("nchw", "rgb") else
                                         {"colour": colour, "layout": layout})
    proc = run_edge("classify", colour_images(tmp_path / "val"), "--model", model, "--preprocess", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():  # each image named as its colour: fed as the model was trained
        record = json.loads(line)
        assert record["top"][0]["label"] == os.path.basename(os.path.dirname(record["file"]))
    assert "accuracy: top-1 100.0% (6/6)" in proc.stderr


@pytest.mark.parametrize("flags,named", [
    (["--mean", "2,3"], "--mean must be three numbers"),
    (["--mean", "0.5,nan,0.5"], "--mean must be three numbers"),
    (["--std", "0,1,1"], "--std must be three numbers between 0.001 and 1.0"),
    (["--size", "100"], "its input is [32, 32] pixels, --size 100"),
    (["--resize", "20"], "--resize 20 must not be smaller than the input size 32"),
    (["--expected-top1", "96"], "--expected-top1 must be between 0.0 and 1.0"),
    (["--layout", "nhwc"], "--layout nhwc means [N, H, W, 3]"),
    (["--labels", "four.txt"], "four.txt: 4 labels, but"),
    (["--labels", "missing.txt"], "missing.txt: labels file not found"),
])
def test_model_add_refuses_a_bad_value_in_one_line_and_writes_nothing(tmp_path, flags, named):
    model = colour_model(tmp_path / "m.onnx")
    (tmp_path / "four.txt").write_text("a\nb\nc\nd\n", encoding="utf-8")
    flags = [str(tmp_path / f) if f.endswith(".txt") else f for f in flags]
    before = sorted(os.listdir(str(tmp_path)))
    assert_refused(edge_here("model", "add", model, *flags), named)
    assert sorted(os.listdir(str(tmp_path))) == before  # no model info, no temporary file


def test_model_add_refuses_what_is_not_a_user_model(tmp_path, small_model):
    (tmp_path / "notes.onnx").write_text("not a model", encoding="utf-8")
    assert_refused(edge_here("model", "add", tmp_path / "notes.onnx"), "notes.onnx: not a valid ONNX model")
    assert_refused(edge_here("model", "add", tmp_path / "m.pt"), "m.pt: not an .onnx file")
    proc = edge_here("model", "add", tmp_path / "notes.onnx", "--colour", "grey")  # argparse's refusal
    assert proc.returncode == 2 and "invalid choice: 'grey'" in proc.stderr.splitlines()[-1]
    model = colour_model(tmp_path / "m.onnx", layout="nhwc")
    assert edge_here("model", "add", model, "--layout", "nhwc").returncode == 0
    assert_refused(edge_here("model", "add", model, "--layout", "nhwc"), "its input was adapted already")
    assert edge_here("model", "add", model).returncode == 0  # recorded again: the adaptation is remembered
    assert read_model_info(model)["trained_input"] == {"colour": "rgb", "layout": "nhwc"}
