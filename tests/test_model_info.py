"""edge.store.model_info: a user's own model is never called untrained, and what a build and an import record of it
is checked (`edge model add` itself: test_user_model.py)."""

import json
import os

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from service_helpers import write_config

from edge.errors import EdgeError
from edge.store.model_info import NO_INFO_WEIGHTS, UNTRAINED_WARNING, read_model_info

from conftest import assert_refused, edge_here, run_edge

COLOURS = {"blue": (255, 0, 0), "green": (0, 255, 0), "red": (0, 0, 255)}  # BGR, as OpenCV writes them


def colour_model(path, *, layout="nchw", colour="rgb", size=32):
    """A 3-class classifier whose score of class i is the mean of input channel i: trained on `colour` order, it
    names an image's dominant colour; its labels (in that order) beside it, no model info."""
    order = ["red", "green", "blue"] if colour == "rgb" else ["blue", "green", "red"]
    shape, axes = ([1, 3, size, size], [2, 3]) if layout == "nchw" else ([1, size, size, 3], [1, 2])
    node = helper.make_node("ReduceMean", ["image"], ["scores"], axes=axes, keepdims=0)
    graph = helper.make_graph([node], "colour", [helper.make_tensor_value_info("image", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    path.with_suffix(".labels.txt").write_text("\n".join(order) + "\n", encoding="utf-8")
    return str(path)


def colour_images(folder, per_class=2):
    """An ImageFolder tree: <colour>/<n>.png of that colour."""
    for name, bgr in COLOURS.items():
        (folder / name).mkdir(parents=True)
        for n in range(per_class):
            cv2.imwrite(str(folder / name / "{}.png".format(n)), np.full((48, 64, 3), bgr, np.uint8))
    return folder


def test_a_model_without_model_info_is_yours_never_untrained(tmp_path):
    model = colour_model(tmp_path / "mine.onnx")
    assert read_model_info(model) == {"weights": NO_INFO_WEIGHTS, "trained": True}
    config = write_config(tmp_path / "edge.yaml", {"preprocess": {"resize": 37, "crop": 32}})
    proc = run_edge("classify", colour_images(tmp_path / "val"), "--config", config, "--model", model)
    assert proc.returncode == 0, proc.stderr
    assert "untrained" not in (proc.stdout + proc.stderr).lower() and "accuracy: top-1 100.0% (6/6)" in proc.stdout
    proc = run_edge("run", "--config", config, "--model", model, "--source", "synthetic", "--frames", 3, "--json")
    assert proc.returncode == 0, proc.stderr
    start = json.loads(proc.stdout.splitlines()[0])
    assert start["weights"] == NO_INFO_WEIGHTS and start["trained"] is True and "warning" not in start
    assert "untrained" not in (proc.stdout + proc.stderr).lower() and "weights: " + NO_INFO_WEIGHTS in proc.stderr


def test_untrained_stays_for_edges_own_seeded_random_export(small_model):
    assert read_model_info(small_model)["trained"] is False
    proc = run_edge("run", "--model", small_model, "--source", "synthetic", "--frames", 3, "--json")
    assert proc.returncode == 0 and UNTRAINED_WARNING in proc.stderr


def test_a_build_refuses_a_regression_set_labelled_for_another_model_in_one_line(tmp_path):
    """The device config's labelled set is ImageNet's (class-index folders): a 3-class model is not gated on it."""
    model = colour_model(tmp_path / "colours.onnx")
    assert edge_here("model", "add", model).returncode == 0
    for i in range(10):  # class-index folders 0..9, as `edge calibrate imagenet` stores 1000
        (tmp_path / "imagenet" / str(i)).mkdir(parents=True)
        cv2.imwrite(str(tmp_path / "imagenet" / str(i) / "a.png"), np.full((48, 64, 3), 20 * i, np.uint8))
    (tmp_path / "frames").mkdir()
    for i in range(4):
        cv2.imwrite(str(tmp_path / "frames" / "{}.png".format(i)), np.full((48, 64, 3), 60 * i, np.uint8))
    imported = {}
    for name, src in (("regression", "imagenet"), ("calibration", "frames")):
        proc = run_edge("calibrate", "import", tmp_path / src, tmp_path / name, "--min-images", 1)
        assert proc.returncode == 0, proc.stderr
        imported[name] = proc.stdout
    assert "regression: 10 images in 10 classes" in imported["regression"]  # the gate's advice, not TensorRT's
    assert "TensorRT recommends" not in imported["regression"] and "TensorRT recommends" in imported["calibration"]
    config = write_config(tmp_path / "edge.yaml", {"model": {"path": model}, "build": {
        "calibration_dir": str(tmp_path / "calibration"), "regression_dir": str(tmp_path / "regression"),
        "engines_dir": str(tmp_path / "engines"), "min_images": 1}})
    line = assert_refused(run_edge("build", "--config", config, "--no-progress"), str(tmp_path / "regression"))
    assert "labelled for another model: 7 of its 10 class folders (3, 4, ...) name no class of the model's 3 " \
           "labels" in line
    assert not os.path.exists(str(tmp_path / "engines" / "colours.int8.onnx"))


def test_an_import_says_which_class_folders_it_kept_by_name_without_labels(tmp_path):
    """Without --labels a class-name folder cannot be checked at import: it is kept, and the import says so."""
    from edge.model.calibration import class_index_of, import_calibration_set

    folder = colour_images(tmp_path / "val")
    lines = []
    imported = import_calibration_set(str(folder), str(tmp_path / "set"), min_images=1, log=lines.append,
                                      relabel=class_index_of(None, dict, str(folder)))
    assert sorted({imported.label_of(n) for n in imported.files}) == ["blue", "green", "red"]
    assert "import: 3 class folders kept by name (blue, green, red): the build reads them as lines of the " \
           "model's labels file; pass --labels to check them now" in lines
    assert not any("TensorRT recommends" in line for line in lines)  # a labelled set: the gate's advice


@pytest.mark.parametrize("value", [96, "0.9", 0, True])
def test_a_recorded_expected_top1_must_be_a_fraction(tmp_path, value):
    """The gate holds the FP32 reference to `expected_top1`: a percentage, a string or a bool there is refused in one
    line naming the file, never read as a figure."""
    model = colour_model(tmp_path / "m.onnx")
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"trained": True, "expected_top1": value}), encoding="utf-8")
    with pytest.raises(EdgeError, match=r"m.json: model info 'expected_top1' must be a fraction in \(0, 1\]"):
        read_model_info(model)
    path.write_text(json.dumps({"trained": True, "expected_top1": 0.96, "expected_top1_set": "x"}), encoding="utf-8")
    with pytest.raises(EdgeError, match="model info 'expected_top1_set' must be 64 hex digits"):
        read_model_info(model)
    path.write_text(json.dumps({"trained": True, "expected_top1": 0.96}), encoding="utf-8")
    assert read_model_info(model)["expected_top1"] == 0.96


def test_the_first_build_records_fp32s_measured_top1_once(tmp_path):
    """A user's model info with no expected_top1 gets FP32's measured figure with the set it was measured on; one
    that records a figure, or no model info at all, is left as it is."""
    from edge.store.model_info import record_measured_top1

    model = colour_model(tmp_path / "m.onnx")
    assert record_measured_top1(model, 0.8, set_sha256="a" * 64, images=50) is None  # no model info: nothing made
    assert not (tmp_path / "m.json").exists()
    (tmp_path / "m.json").write_text(json.dumps({"trained": True, "weights": "mine"}), encoding="utf-8")
    assert record_measured_top1(model, 0.8, set_sha256="a" * 64, images=50) == str(tmp_path / "m.json")
    info = read_model_info(model)
    assert (info["expected_top1"], info["expected_top1_set"], info["expected_top1_images"]) == (0.8, "a" * 64, 50)
    assert info["weights"] == "mine"
    assert record_measured_top1(model, 0.5, set_sha256="b" * 64, images=9) is None  # held to the first figure
    assert read_model_info(model)["expected_top1"] == 0.8
