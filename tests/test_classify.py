"""`edge classify`: top-k for image files and folders through the runtime stages; bad files named and skipped."""

import json

import cv2
import numpy as np
import pytest
from service_helpers import write_config

from edge.cli.classify import main

from conftest import run_edge


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    cv2.imwrite(str(folder / "a.png"), rng.integers(0, 255, (240, 320, 3), np.uint8))
    cv2.imwrite(str(folder / "sub" / "b.jpg"), rng.integers(0, 255, (300, 200, 3), np.uint8))
    cv2.imwrite(str(folder / "grey.png"), rng.integers(0, 255, (64, 64), np.uint8))  # read as 3-channel BGR
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (folder / "notes.txt").write_text("not an image, and not listed: only image files are taken from a folder",
                                      encoding="utf-8")
    return folder


def test_table_covers_folders_recursively_and_names_what_it_skipped(small_model, images, tmp_path, capsys):
    missing = str(tmp_path / "missing.png")
    assert main([str(images), missing, "--model", small_model, "--top-k", "3"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["image", "#", "score"]
    firsts = [line.split()[0] for line in lines[1:] if not line.startswith(" ")]
    assert [f.split("photos/")[1] for f in firsts] == ["a.png", "grey.png", "sub/b.jpg"]
    assert len(lines) == 1 + 3 * 3
    assert "skipped {}: not a readable image".format(images / "broken.jpg") in err
    assert "skipped {}: no such file or folder".format(missing) in err
    assert "UNTRAINED WEIGHTS" in err and "notes.txt" not in err


def test_json_lines_give_the_same_top_k_as_the_model(small_model, images, capsys):
    import onnxruntime as ort

    from edge.config import PreprocessConfig
    from edge.infer.preprocess import CpuPreprocessor

    assert main([str(images / "a.png"), "--model", small_model, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["file"].endswith("a.png") and len(record["top"]) == 5
    logits = ort.InferenceSession(small_model, providers=["CPUExecutionProvider"]).run(
        None, {"input": CpuPreprocessor(PreprocessConfig())(cv2.imread(str(images / "a.png")))})[0][0]
    assert [t["index"] for t in record["top"]] == list(np.argsort(-logits)[:5])


def test_nothing_readable_is_exit_2_in_one_line(small_model, images):
    proc = run_edge("classify", images / "broken.jpg", images / "notes.txt", "--model", small_model)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == "edge classify: error: no image could be read (2 skipped)"


def test_image_types_it_does_not_read_are_named_not_silently_left_out(small_model, images, capsys):
    for name in ("anim.gif", "favicon.ico", "scan.jp2"):
        (images / name).write_bytes(b"not read either way")
    assert main([str(images), "--model", small_model, "--json"]) == 0
    out, err = capsys.readouterr()
    assert len([json.loads(line) for line in out.splitlines()]) == 3  # every line valid JSON
    for name in ("anim.gif", "favicon.ico", "scan.jp2"):
        assert "skipped {}: .{} images are not read".format(images / name, name.rsplit(".", 1)[1]) in err
    assert "notes.txt" not in err  # not an image at all: still not listed


def test_labels_outside_an_ascii_locale_print_escaped_not_as_a_traceback(tiny_classifiers, images, tmp_path):
    """LC_ALL=C with UTF-8 mode off: stdout's encoding is ASCII; a label such as 'café' prints as caf\\xe9."""
    names = ["café", "東京"] + ["class{}".format(i) for i in range(8)]
    (tmp_path / "labels.txt").write_text("".join(n + "\n" for n in names), encoding="utf-8")
    config = write_config(tmp_path / "edge.yaml", {"model": {"path": tiny_classifiers[0],
                                                             "labels": str(tmp_path / "labels.txt")}})
    proc = run_edge("classify", images / "a.png", "--config", config, "--top-k", "10",
                    env={"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "caf\\xe9" in proc.stdout and "\\u6771\\u4eac" in proc.stdout


def test_an_image_folder_tree_is_scored_top1_and_top5_by_name_or_index(tmp_path):
    """FOLDER/<label>/ and FOLDER/<index>/ (the calibration sets' layout) are scored; a folder naming no class is
    named, not scored; images right in FOLDER are classified only."""
    from test_model_info import colour_images, colour_model

    model = colour_model(tmp_path / "colours.onnx")  # labels red, green, blue
    val = colour_images(tmp_path / "val")
    (val / "green").rename(val / "1")  # green's index
    (val / "blue").rename(val / "sky")  # no class: not scored
    cv2.imwrite(str(val / "loose.png"), np.zeros((8, 8, 3), np.uint8))
    config = write_config(tmp_path / "edge.yaml", {"preprocess": {"resize": 37, "crop": 32}})
    proc = run_edge("classify", val, "--config", config, "--model", model, "--top-k", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == ("accuracy: top-1 100.0% (4/4) top-5 - (--top-k 5) over 4 images in "
                                            "class folders; not scored: 2 images in 1 folders that name no class "
                                            "(sky)")
    proc = run_edge("classify", val, "--config", config, "--model", model, "--json")
    assert proc.returncode == 0 and "accuracy: top-1 100.0% (4/4) top-5 100.0% (4/4)" in proc.stderr
    assert len(proc.stdout.splitlines()) == 7  # every image a JSON line, the accuracy on stderr


def test_a_folder_named_by_a_non_ascii_digit_is_not_scored_not_a_traceback(tmp_path):
    """'²'.isdigit() is true and int('²') fails: a class index is ASCII digits only (edge.model.class_labels)."""
    from test_model_info import colour_images, colour_model

    model = colour_model(tmp_path / "colours.onnx")
    val = colour_images(tmp_path / "val")
    (val / "blue").rename(val / "\u00b2")
    config = write_config(tmp_path / "edge.yaml", {"preprocess": {"resize": 37, "crop": 32}})
    proc = run_edge("classify", val, "--config", config, "--model", model, "--top-k", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].endswith("not scored: 2 images in 1 folders that name no class (\u00b2)")
