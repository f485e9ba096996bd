"""The accuracy gate on a model that has learned something: a sound INT8 model passes, broken ones fail."""

import dataclasses
import json

import numpy as np
import pytest

from edge.build.calibration import CalibrationSet, load_calibration_set
from edge.build.gate import clopper_pearson, enforce, evaluate, paired_drop, resolve_labels, write_report
from edge.build.plan import onnx_runner
from edge.build.quantize import quantize_qdq
from edge.config import GateConfig, PreprocessConfig
from edge.errors import EdgeError

LABELS = [str(i) for i in range(10)]
quiet = lambda *a: None  # noqa: E731


@pytest.fixture(scope="module")
def reference(digits):
    """The FP32 model run as the build's gate runs it (and each candidate below)."""
    with onnx_runner(digits.onnx) as infer:
        yield infer


def gate(digits, reference, candidate_path, **thresholds):
    with onnx_runner(candidate_path) as candidate:
        return evaluate(reference, candidate, load_calibration_set(digits.regression), digits.preprocess,
                        GateConfig(**thresholds), LABELS)


def test_sound_int8_passes(digits, digits_qdq, reference):
    result = gate(digits, reference, digits_qdq)
    r = result.report
    assert result.passed and r["failures"] == []
    assert r["samples"] == r["labelled"] == 297
    assert r["agreement"] >= 0.98 and r["mean_cosine"] >= 0.99 and r["top1_drop_pp"] <= 1.0
    # The FP32 reference through the runtime's preprocessing scores what torch scored in training.
    assert abs(r["reference_top1"] - digits.torch_top1) <= 1 / 297 + 1e-9
    assert len(r["flips"]) == round((1 - r["agreement"]) * 297)
    assert 0.0 < r["min_cosine"] <= r["mean_cosine"] <= 1.0


def test_grey_calibration_fails_with_reasons_and_report(digits, reference, tmp_path):
    broken = str(tmp_path / "grey.onnx")
    quantize_qdq(digits.onnx, broken, load_calibration_set(digits.grey_calibration), digits.preprocess, "minmax",
                 False, show_progress=False, log=quiet)
    result = gate(digits, reference, broken)
    r = result.report
    assert not result.passed
    assert r["agreement"] < 0.9 and r["mean_cosine"] < 0.95 and r["top1_drop_pp"] > 5
    assert not any(f.startswith("top-1 agreement") for f in r["failures"])  # labelled: judged by the drop
    assert any(f.startswith("mean logit cosine") for f in r["failures"])
    assert any(f.startswith("top-1 accuracy drop") for f in r["failures"])
    flip = r["flips"][0]
    assert set(flip) == {"file", "reference", "candidate", "label", "cosine"} and flip["reference"] != flip["candidate"]
    assert flip["label"] == flip["file"].split("/")[0]
    report = str(tmp_path / "gate.json")
    write_report(report, result, {"artifact": "x"})
    saved = json.load(open(report))
    assert saved["passed"] is False and saved["artifact"] == "x" and len(saved["flips"]) == len(r["flips"])
    with pytest.raises(EdgeError, match="accuracy gate failed: mean logit cosine") as err:
        enforce(result, report)
    assert err.value.exit_code == 1 and report in str(err.value) and "\n" not in str(err.value)


def test_unnormalised_calibration_fails(digits, reference, tmp_path):
    raw = dataclasses.replace(digits.preprocess, mean=[0.0] * 3, std=[1 / 255.0] * 3)  # 0-255 inputs
    broken = str(tmp_path / "raw.onnx")
    quantize_qdq(digits.onnx, broken, load_calibration_set(digits.calibration), raw, "minmax", True,
                 show_progress=False, log=quiet)
    r = gate(digits, reference, broken).report
    assert not r["passed"] and r["agreement"] < 0.5


def swapping_candidate(reference, images, targets):
    """A candidate that swaps the top-2 logits on exactly the images named in `targets`."""
    current = {}

    def read(name, _read=images.read):
        current["name"] = name
        return _read(name)

    images.read = read  # note which image each tensor came from

    def candidate(tensor):
        out = reference(tensor).copy()
        if current["name"] in targets:
            order = np.argsort(-out[0])
            out[0, order[0]], out[0, order[1]] = out[0, order[1]], out[0, order[0]]
        return out

    return candidate


def test_metrics_are_exact_on_a_known_candidate(digits, reference):
    """Swapping the top-2 logits on exactly 3 unlabelled images: agreement and flips must say 3."""
    s = load_calibration_set(digits.calibration)
    targets = set(s.files[::30])
    candidate = swapping_candidate(reference, s, targets)
    r = evaluate(reference, candidate, s, digits.preprocess, GateConfig(min_agreement=0.96)).report
    assert len(targets) == 3 and len(r["flips"]) == 3 and r["labelled"] == 0
    assert r["agreement"] == r["unlabelled_agreement"] == round(61 / 64, 6) and not r["passed"]
    assert {f["file"] for f in r["flips"]} == targets
    assert "top-1 agreement 0.9531 < 0.96" in r["failures"]


def test_labelled_images_are_judged_by_the_drop_not_the_agreement(digits, reference):
    """The same swap on 3 labelled images: agreement 294/297 is reported, not judged; the flips count as
    right->wrong or wrong->right by their labels, and a drop of at most 1 pp is within the default limit."""
    s = load_calibration_set(digits.regression)
    targets = set(s.files[::100])
    r = evaluate(reference, swapping_candidate(reference, s, targets), s, digits.preprocess,
                 GateConfig(min_agreement=0.99), LABELS).report
    assert r["agreement"] == round(294 / 297, 6) and "unlabelled_agreement" not in r
    assert len(r["flips"]) == 3
    assert r["right_to_wrong"] == sum(flip["reference"] == flip["label"] for flip in r["flips"])
    assert r["wrong_to_right"] == sum(flip["candidate"] == flip["label"] for flip in r["flips"])
    assert r["passed"] and r["failures"] == []


def test_unlabelled_set_judges_agreement_and_cosine_only(digits, reference, tmp_path):
    s = load_calibration_set(digits.calibration)
    r = evaluate(reference, reference, s, digits.preprocess, GateConfig()).report
    assert r["passed"] and r["labelled"] == 0 and "top1_drop_pp" not in r
    assert r["agreement"] == 1.0 and r["mean_cosine"] == pytest.approx(1.0)


def test_labels_from_subfolders_by_name_or_index(digits):
    s = load_calibration_set(digits.regression)
    truth = resolve_labels(s, LABELS)
    assert truth == [int(name.split("/")[0]) for name in s.files]
    assert resolve_labels(s, None) == truth  # class indices when there is no labels file
    renamed = CalibrationSet(s.root, ["cat/0001.png"], s.sha256)
    with pytest.raises(EdgeError, match="subfolder 'cat' is neither a label"):
        resolve_labels(renamed, LABELS)


# --- the verdict knows its sample size ------------------------------------------------------------------------

def test_exact_statistics_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for k, n in ((0, 1), (1, 1), (0, 20), (3, 20), (7, 9), (50, 120), (500, 1000)):
        assert clopper_pearson(k, n) == pytest.approx(tuple(stats.binomtest(k, n).proportion_ci(method="exact")),
                                                      abs=1e-9)
    for b, c in ((1, 0), (5, 0), (6, 0), (9, 4), (30, 31)):
        p = stats.binomtest(b, b + c, 0.5, alternative="greater").pvalue
        assert paired_drop(b, c, 100)["mcnemar_p"] == pytest.approx(p, abs=1e-6)


@pytest.fixture(scope="module")
def forty(tmp_path_factory):
    """40 labelled images (class index subfolders 0-3), each a distinct solid colour."""
    import cv2

    from edge.build.calibration import import_calibration_set

    raw = tmp_path_factory.mktemp("forty-raw")
    for i in range(40):
        (raw / str(i % 4)).mkdir(exist_ok=True)
        cv2.imwrite(str(raw / str(i % 4) / "{:02d}.png".format(i)), np.full((32, 32, 3), 5 * i, np.uint8))
    return import_calibration_set(str(raw), str(tmp_path_factory.mktemp("sets") / "forty"), log=quiet)


def paired(images, wrong_reference, right_to_wrong, wrong_to_right):
    """Judge constructed outcomes: the reference is wrong on the first `wrong_reference` images; the candidate
    turns `right_to_wrong` of its right answers wrong and `wrong_to_right` of its wrong answers right."""
    order = sorted(images.files)
    truth = {n: int(n.split("/")[0]) for n in order}
    ref_pred = {n: (truth[n] + (1 if i < wrong_reference else 0)) % 10 for i, n in enumerate(order)}
    cand_pred = dict(ref_pred)
    for n in order[wrong_reference:wrong_reference + right_to_wrong]:
        cand_pred[n] = truth[n] + 5
    for n in order[:wrong_to_right]:
        cand_pred[n] = truth[n]
    current = {}

    def read(name, _read=images.read):
        current["name"] = name
        return _read(name)

    def logits(pred):
        return lambda tensor: np.eye(10, dtype=np.float32)[None, pred[current["name"]]] + 0.01

    s = CalibrationSet(images.root, images.files, images.sha256)
    s.read = read
    return evaluate(logits(ref_pred), logits(cand_pred), s, PreprocessConfig(resize=32, crop=32),
                    GateConfig(min_agreement=0.0, min_mean_cosine=-1.0, max_top1_drop_pp=1.0))


def test_no_net_drop_passes_with_its_flips_counted_each_way(forty):
    r = paired(forty, 10, 3, 3).report
    assert r["verdict"] == "pass" and r["passed"] and r["failures"] == r["inconclusive"] == []
    assert (r["right_to_wrong"], r["wrong_to_right"], r["labelled"]) == (3, 3, 40)
    assert r["reference_top1"] == r["candidate_top1"] == 0.75 and r["top1_drop_pp"] == 0.0
    lo, hi = r["top1_drop_interval_pp"]
    assert lo < 0 < hi and r["reference_top5"] == 1.0


def test_one_flip_in_forty_is_too_few_to_judge(forty, tmp_path):
    result = paired(forty, 10, 1, 0)
    r = result.report
    assert r["verdict"] == "inconclusive" and r["passed"] and r["failures"] == []
    assert r["top1_drop_pp"] == 2.5 and r["mcnemar_p"] == 0.5
    assert r["inconclusive"] == ["too few labelled images to judge a drop of 2.50 pp (95% interval -2.38..+2.50 pp, "
                                 "1 right->wrong, 0 wrong->right of 40)"]
    assert result.verdict == "inconclusive" and "inconclusive: too few labelled images" in result.summary()
    enforce(result, str(tmp_path / "gate.json"))  # does not fail the build
    write_report(str(tmp_path / "gate.json"), result)
    assert json.load(open(tmp_path / "gate.json"))["verdict"] == "inconclusive"


def test_the_same_drop_fails_once_it_cannot_be_chance(forty):
    """Five one-way flips could be chance (exact p = 1/32, interval reaches 0); six cannot (p = 1/64)."""
    five, six = paired(forty, 10, 5, 0), paired(forty, 10, 6, 0)
    assert five.report["verdict"] == "inconclusive" and five.report["top1_drop_interval_pp"][0] < 0
    assert six.report["verdict"] == "fail" and not six.passed and six.report["top1_drop_interval_pp"][0] > 0
    assert six.failures == ["top-1 accuracy drop 15.00 pp (95% interval +1.22..+15.00 pp, 6 right->wrong, "
                            "0 wrong->right of 40) > 1.0"]
    with pytest.raises(EdgeError, match="accuracy gate failed: top-1 accuracy drop 15.00 pp"):
        enforce(six, "gate.json")
