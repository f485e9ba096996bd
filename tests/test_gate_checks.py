"""edge.model.gate_checks, on constructed numbers: the FP32 reference held to its recorded figure (or to a multiple of
chance), ImageNet's names in another order, a class folder FP32 files under one other class, and a collapsed class
found label-free."""

import numpy as np
import pytest

from edge.model.gate_checks import (
    CHANCE_MULTIPLE,
    MIN_CLASS_IMAGES,
    collapse_failure,
    collapsed_classes,
    labels_failure,
    per_class,
    reference_check,
)


def test_the_reference_is_held_to_its_recorded_figure_or_else_to_a_multiple_of_chance():
    assert "reference_failure" not in reference_check(95, 100, 10, {"expected_top1": 0.96}, "set", 0.95)
    failed = reference_check(85, 100, 10, {"expected_top1": 0.99}, "set", 0.95)
    assert "is below the 99.0 % its model info records" in failed["reference_failure"]
    other_set = reference_check(85, 100, 10, {"expected_top1": 0.99, "expected_top1_set": "other"}, "set", 0.95)
    assert "reference_failure" not in other_set and other_set["reference_floor"] == CHANCE_MULTIPLE / 10
    at_chance = reference_check(10, 100, 10, {}, "set", 0.95)
    assert "5x chance" in at_chance["reference_failure"]
    assert reference_check(0, 10, 2, {}, "set", 0.95)["reference_floor"] == 0.75  # 2 classes: halfway to 100 %


def test_imagenet_names_in_another_order_are_named():
    models = pytest.importorskip("torchvision.models")
    names = list(models.MobileNet_V3_Large_Weights.IMAGENET1K_V1.meta["categories"])
    assert labels_failure(names) is None and labels_failure(names[:999]) is None
    assert "ImageNet's class names in another order (line 1 says 'goldfish'" in labels_failure(names[1:] + names[:1])


def test_a_folder_fp32_files_under_one_other_class_is_named_and_the_worst_class_comes_first():
    truth = np.array([1] * MIN_CLASS_IMAGES + [2] * MIN_CLASS_IMAGES)
    ref = np.array([2] * MIN_CLASS_IMAGES + [2] * MIN_CLASS_IMAGES)  # FP32 calls every '1' a '2'
    cand = np.array([2] * MIN_CLASS_IMAGES + [2] * (MIN_CLASS_IMAGES - 4) + [0] * 4)
    out = per_class(ref, cand, truth, lambda i: "c{}".format(i))
    assert out["swapped_folders"] == ["folder of class 'c1': FP32 calls {0} of its {0} images 'c2'".format(
        MIN_CLASS_IMAGES)]
    assert out["worst_class"] == {"class": "c2", "images": MIN_CLASS_IMAGES, "reference_right": MIN_CLASS_IMAGES,
                                  "candidate_right": MIN_CLASS_IMAGES - 4}
    few = per_class(ref[:MIN_CLASS_IMAGES - 1], ref[:MIN_CLASS_IMAGES - 1], truth[:MIN_CLASS_IMAGES - 1], str)
    assert few["swapped_folders"] == []  # too few images to say


def test_a_class_whose_scores_hardly_move_in_the_candidate_is_collapsed():
    ref = np.random.default_rng(0).normal(size=(200, 100))  # many classes: the per-image centring hardly moves one
    cand = ref.copy()
    cand[:, 5] /= 64.0
    top5 = lambda scores: np.argsort(-scores, axis=1)[:, :5]  # noqa: E731
    out = collapsed_classes(ref, cand, top5(ref), top5(cand), lambda i: "c{}".format(i))
    assert [c["class"] for c in out["collapsed_classes"]] == ["c5"] and out["min_spread_ratio"] < 0.25
    assert collapse_failure(out).startswith("1 class collapsed in the candidate: 'c5' (score spread x0.1")
    same = collapsed_classes(ref, ref, top5(ref), top5(ref), str)
    assert same["collapsed_classes"] == [] and collapse_failure(same) is None
