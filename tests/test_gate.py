"""The accuracy gate on a model that has learned something: a sound INT8 model passes, broken ones fail; and on
constructed outcomes, the verdict states a claim the sample supports, fails on any non-finite output, and never
passes on NaN.

Premises hold on any machine: the digits model's sound and broken INT8 sit far from the thresholds these tests set
(sound: at most 2 changed answers of 297 measured, a 5 pp limit passes up to 4; grey calibration: mean cosine
0.72-0.90 against 0.98), and the statistics are checked on constructed outcomes."""

import dataclasses
import json

import numpy as np
import pytest

from edge.config import GateConfig, PreprocessConfig
from edge.errors import EdgeError, one_line
from edge.model.calibration import CalibrationSet, load_calibration_set
from edge.model.gate import enforce, evaluate, resolve_labels, write_report
from edge.model.gate_stats import Z95, clopper_pearson, labels_needed, paired_drop_interval, top1_claim
from edge.model.plan import onnx_runner
from edge.model.quantize import quantize_qdq

LABELS = [str(i) for i in range(10)]
DIGITS_GATE = GateConfig(max_top1_drop_pp=5.0)  # 297 labelled digits: a sound model's upper bound stays below
quiet = lambda *a: None  # noqa: E731


@pytest.fixture(scope="module")
def reference(digits):
    """The FP32 model run as the build's gate runs it (and each candidate below)."""
    with onnx_runner(digits.onnx) as infer:
        yield infer


def gate(digits, reference, candidate_path, thresholds=DIGITS_GATE):
    with onnx_runner(candidate_path) as candidate:
        return evaluate(reference, candidate, load_calibration_set(digits.regression), digits.preprocess,
                        thresholds, LABELS)


def test_sound_int8_passes_with_its_claim(digits, digits_qdq, reference):
    result = gate(digits, reference, digits_qdq)
    r = result.report
    assert result.passed and r["verdict"] == "pass" and r["failures"] == r["inconclusive"] == []
    assert r["samples"] == r["labelled"] == 297
    lo, hi = r["top1_drop_interval_pp"]
    assert lo <= r["top1_drop_pp"] <= hi <= 5.0
    assert r["top1_claim"] == "INT8 keeps {:.1f} of FP32's {:.1f} % top-1; top-1 drop <= {:.2f} pp at 95 % (297 " \
        "labelled images; limit 5 pp)".format(100 * r["candidate_top1"], 100 * r["reference_top1"], hi)
    assert r["top1_claim"] in result.summary() and r["fidelity_verdict"] == "pass"
    # The FP32 reference through the runtime's preprocessing scores what torch scored in training.
    assert abs(r["reference_top1"] - digits.torch_top1) <= 1 / 297 + 1e-9
    assert len(r["flips"]) == round((1 - r["agreement"]) * 297)
    assert 0.0 < r["min_cosine"] <= r["p5_cosine"] <= r["mean_cosine"] <= 1.0
    assert r["min_detectable_drop_pp"] > 5.0 and r["non_finite"] == [] and not r["reference_near_uniform"]


def test_grey_calibration_fails_with_reasons_and_report(digits, reference, tmp_path):
    broken = str(tmp_path / "grey.onnx")
    quantize_qdq(digits.onnx, broken, load_calibration_set(digits.grey_calibration), digits.preprocess, "minmax",
                 False, show_progress=False, log=quiet)
    result = gate(digits, reference, broken)
    r = result.report
    assert not result.passed and r["verdict"] == "fail"
    assert r["agreement"] < 0.9 and r["mean_cosine"] < 0.95 and r["top1_drop_pp"] > 5
    assert not any(f.startswith("top-1 agreement") for f in r["failures"])  # labelled: judged by the drop
    assert any(f.startswith("mean logit cosine") for f in r["failures"])
    assert any("; top-1 drop >= " in f for f in r["failures"]), r["failures"]
    flip = r["flips"][0]
    assert set(flip) == {"file", "reference", "candidate", "label", "cosine", "reference_margin", "candidate_margin"}
    assert flip["reference"] != flip["candidate"] and flip["reference_margin"] >= 0 and flip["candidate_margin"] >= 0
    assert flip["label"] == flip["file"].split("/")[0]
    report = str(tmp_path / "gate.json")
    write_report(report, result, {"artifact": "x"})
    saved = json.load(open(report, encoding="utf-8"))
    assert saved["passed"] is False and saved["artifact"] == "x" and len(saved["flips"]) == len(r["flips"])
    with pytest.raises(EdgeError, match="accuracy gate failed: .*mean logit cosine") as err:
        enforce(result, report)
    assert err.value.exit_code == 1 and report in str(err.value) and "\n" not in str(err.value)


def test_unnormalised_calibration_fails(digits, reference, tmp_path):
    raw = dataclasses.replace(digits.preprocess, mean=[0.0] * 3, std=[1 / 255.0] * 3)  # 0-255 inputs
    broken = str(tmp_path / "raw.onnx")
    quantize_qdq(digits.onnx, broken, load_calibration_set(digits.calibration), raw, "minmax", True,
                 show_progress=False, log=quiet)
    r = gate(digits, reference, broken).report
    assert r["verdict"] == "fail" and r["agreement"] < 0.5


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
    assert "top-1 agreement 0.9531 < 0.96 on unlabelled images" in r["failures"]


def test_labelled_images_are_judged_by_the_drop_not_the_agreement(digits, reference):
    """The same swap on 3 labelled images: agreement 294/297 is reported, not judged; the flips count as
    right->wrong or wrong->right by their labels, and at most 3 changed answers of 297 pass a 5 pp limit."""
    s = load_calibration_set(digits.regression)
    targets = set(s.files[::100])
    r = evaluate(reference, swapping_candidate(reference, s, targets), s, digits.preprocess,
                 dataclasses.replace(DIGITS_GATE, min_agreement=0.99), LABELS).report
    assert r["agreement"] == round(294 / 297, 6) and "unlabelled_agreement" not in r
    assert len(r["flips"]) == 3
    assert r["right_to_wrong"] == sum(flip["reference"] == flip["label"] for flip in r["flips"])
    assert r["wrong_to_right"] == sum(flip["candidate"] == flip["label"] for flip in r["flips"])
    assert r["passed"] and r["failures"] == []


def test_unlabelled_set_judges_agreement_cosine_and_confident_flips(digits, reference):
    s = load_calibration_set(digits.calibration)
    r = evaluate(reference, reference, s, digits.preprocess, GateConfig(max_confident_flip_pct=50.0)).report
    assert r["passed"] and r["labelled"] == 0 and "top1_drop_pp" not in r and r["claims"] == [r["fidelity_claim"]]
    assert r["agreement"] == 1.0 and r["mean_cosine"] == pytest.approx(1.0)
    assert r["confident_flips"] == 0 and r["confident_images"] > 5  # 0 of 6 is within 50 % at 95 %


def test_labels_from_subfolders_by_name_or_index(digits):
    s = load_calibration_set(digits.regression)
    truth = resolve_labels(s, LABELS)
    assert truth == [int(name.split("/")[0]) for name in s.files]
    assert resolve_labels(s, None) == truth  # class indices when there is no labels file
    renamed = CalibrationSet(s.root, ["cat/0001.png"], s.sha256)
    with pytest.raises(EdgeError, match="subfolder 'cat' is neither a label"):
        resolve_labels(renamed, LABELS)


# --- the statistics ------------------------------------------------------------------------------------------

def test_exact_statistics_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for k, n in ((0, 1), (1, 1), (0, 20), (3, 20), (7, 9), (50, 120), (500, 1000)):
        assert clopper_pearson(k, n) == pytest.approx(tuple(stats.binomtest(k, n).proportion_ci(method="exact")),
                                                      abs=1e-9)
    for b, c in ((1, 0), (5, 0), (6, 0), (9, 4), (30, 31)):
        p = stats.binomtest(b, b + c, 0.5, alternative="greater").pvalue
        assert top1_claim(b, c, 100, 1.0)["mcnemar_p"] == pytest.approx(p, abs=1e-6)


def test_the_paired_interval_is_honest_without_discordant_pairs_and_wald_like_with_many():
    # no flip: Tango's bound solves n d / (1 - d) = z^2, so 0 of 20 still allows a 16.1 pp drop
    for n in (20, 297, 520):
        lo, hi = paired_drop_interval(0, 0, n)
        assert hi == pytest.approx(Z95 ** 2 / (n + Z95 ** 2), abs=1e-9) and lo == pytest.approx(-hi)
    b, c, n = 600, 400, 10000  # many pairs: the Wald interval
    half = 1.959964 * np.sqrt((b + c) / n ** 2 - (b - c) ** 2 / n ** 3)
    lo, hi = paired_drop_interval(b, c, n)
    assert lo == pytest.approx((b - c) / n - half, abs=2e-4) and hi == pytest.approx((b - c) / n + half, abs=2e-4)
    assert paired_drop_interval(3, 1, 40)[1] < paired_drop_interval(4, 1, 40)[1]  # monotone in b
    # what a +-1 pp claim needs at 3-6 % discordance (docs/build.md)
    assert (labels_needed(0.03, 1.0), labels_needed(0.06, 1.0)) == (2355, 4710)


# --- the verdict on constructed outcomes --------------------------------------------------------------------

def solid_colours(tmp_path_factory, name):
    """40 labelled images (class index subfolders 0-3), each a distinct solid colour, imported as set `name`."""
    import cv2

    from edge.model.calibration import import_calibration_set

    raw = tmp_path_factory.mktemp(name + "-raw")
    for i in range(40):
        (raw / str(i % 4)).mkdir(exist_ok=True)
        cv2.imwrite(str(raw / str(i % 4) / "{:02d}.png".format(i)), np.full((32, 32, 3), 5 * i, np.uint8))
    return import_calibration_set(str(raw), str(tmp_path_factory.mktemp("sets") / name), log=quiet)


@pytest.fixture(scope="module")
def forty(tmp_path_factory):
    return solid_colours(tmp_path_factory, "forty")


def by_image(images, outputs, *, manifest=False):
    """A CalibrationSet reading `images`' files (with their manifest: the sizes strata are read from) and models
    answering `outputs[model][file]` for each image read."""
    current = {}

    def read(name, _read=images.read):
        current["name"] = name
        return _read(name)

    s = CalibrationSet(images.root, images.files, images.sha256, images.manifest if manifest else {})
    s.read = read
    return s, [lambda tensor, out=out: out[current["name"]] for out in outputs]


def paired(images, wrong_reference, right_to_wrong, wrong_to_right, limit=1.0, first=None):
    """Judge constructed outcomes: the reference is wrong on the first `wrong_reference` images; the candidate
    turns `right_to_wrong` of its right answers wrong and `wrong_to_right` of its wrong answers right."""
    order = sorted(images.files, key=lambda n: n.split("/")[1])[:first]  # the folders interleaved
    truth = {n: int(n.split("/")[0]) for n in order}
    ref_pred = {n: (truth[n] + (1 if i < wrong_reference else 0)) % 10 for i, n in enumerate(order)}
    cand_pred = dict(ref_pred)
    for n in order[wrong_reference:wrong_reference + right_to_wrong]:
        cand_pred[n] = truth[n] + 5
    for n in order[:wrong_to_right]:
        cand_pred[n] = truth[n]
    s, (ref, cand) = by_image(CalibrationSet(images.root, order, images.sha256), [
        {n: 10 * np.eye(10, dtype=np.float32)[None, p] for n, p in pred.items()} for pred in (ref_pred, cand_pred)])
    return evaluate(ref, cand, s, PreprocessConfig(resize=32, crop=32),
                    GateConfig(min_agreement=0.0, min_mean_cosine=-1.0, min_p5_cosine=-1.0,
                               max_confident_flip_pct=100.0, max_top1_drop_pp=limit))


def test_a_drop_passes_only_when_its_upper_bound_is_within_the_limit(forty):
    r = paired(forty, 10, 0, 0, limit=10.0).report  # 0 of 40: at most 8.76 pp at 95 %
    assert r["verdict"] == "pass" and r["top1_drop_interval_pp"][1] == pytest.approx(8.76, abs=0.01)
    assert r["top1_claim"] == "INT8 keeps 75.0 of FP32's 75.0 % top-1; top-1 drop <= 8.76 pp at 95 % (40 labelled " \
                              "images; limit 10 pp)"
    r = paired(forty, 10, 3, 3, limit=10.0).report  # no net drop, but 6 discordant pairs: the bound is wider
    assert r["verdict"] == "inconclusive" and r["top1_drop_pp"] == 0.0
    assert (r["right_to_wrong"], r["wrong_to_right"], r["labelled"]) == (3, 3, 40)
    assert r["reference_top1"] == r["candidate_top1"] == 0.75 and r["reference_top5"] == 1.0


def test_twenty_labelled_images_are_inconclusive_and_install_nothing(forty, tmp_path):
    result = paired(forty, 5, 0, 0, limit=1.0, first=20)
    r = result.report
    assert r["verdict"] == "inconclusive" and not result.passed and r["labelled"] == 20
    assert r["top1_drop_interval_pp"][1] == pytest.approx(16.11, abs=0.01)
    assert r["inconclusive"][0].startswith("INT8 keeps 75.0 of FP32's 75.0 % top-1; cannot tell: the drop is "
                                           "-16.11..+16.11 pp at 95 % on 20 labelled images; deciding a 1 pp limit "
                                           "needs ~")
    assert "(planning assumption: 1 in 20 images changes correctness (none did here)" in r["inconclusive"][0]
    assert r["min_detectable_drop_pp"] > 10
    report = "/var/lib/jetson-edge/engines/mobilenet_v3_large.int8.gate.json"  # not written: enforce only names it
    with pytest.raises(EdgeError) as err:
        enforce(result, report)
    line = str(err.value)
    assert line == "accuracy gate inconclusive, nothing installed (--accept-inconclusive installs it anyway): top-1 " \
                   "drop -16.11..+16.11 pp at 95 % vs the 1 pp limit; ~{} labelled images decide it (report: {})" \
                   .format(r["labels_needed"], report)
    assert err.value.exit_code == 1 and one_line(line) == line  # printed whole: never cut inside a word
    enforce(result, str(tmp_path / "gate.json"), accept_inconclusive=True)  # installs, said so by the build


def test_a_drop_fails_once_its_lower_bound_is_beyond_the_limit(forty):
    """Four one-way flips of 40 could still be within 1 pp (lower bound +0.36 pp); five cannot (+2.64 pp)."""
    four, five = paired(forty, 10, 4, 0), paired(forty, 10, 5, 0)
    assert four.report["verdict"] == "inconclusive" and four.report["top1_drop_interval_pp"][0] < 1.0
    assert five.report["verdict"] == "fail" and not five.passed
    assert five.failures == ["INT8 keeps 62.5 of FP32's 75.0 % top-1; top-1 drop >= 2.64 pp at 95 %, beyond the 1 pp "
                             "limit (40 labelled images); worst class 2: 8 -> 6 of 10 right"]
    with pytest.raises(EdgeError, match="accuracy gate failed: INT8 keeps 62.5 of FP32's 75.0 % top-1; top-1 drop >= "
                                        "2.64 pp"):
        enforce(five, "gate.json")


@pytest.mark.parametrize("model, value", [("candidate", np.inf), ("candidate", np.nan), ("reference", -np.inf)])
def test_a_non_finite_output_fails_in_one_line_naming_the_image(forty, tmp_path, model, value):
    finite = {n: np.linspace(-1, 1, 10, dtype=np.float32)[None] for n in forty.files}
    bad = {n: v.copy() for n, v in finite.items()}
    victim = forty.files[7]
    bad[victim][0, 3] = value
    outputs = [bad, finite] if model == "reference" else [finite, bad]
    s, (ref, cand) = by_image(forty, outputs)
    lenient = GateConfig(min_agreement=0.0, min_mean_cosine=-1.0, min_p5_cosine=-1.0, max_confident_flip_pct=100.0,
                         max_top1_drop_pp=100.0)  # nothing but the non-finite value can fail it
    result = evaluate(ref, cand, s, PreprocessConfig(resize=32, crop=32), lenient)
    r = result.report
    assert r["verdict"] == "fail" and r["non_finite"][0]["file"] == victim and r["non_finite"][0]["model"] == model
    assert r["failures"][0] == "non-finite output: the {} gave {} NaN and {} Inf values on {}".format(
        model, int(np.isnan(value)), int(np.isinf(value)), victim)
    with pytest.raises(EdgeError, match="^accuracy gate failed: non-finite output: the " + model) as err:
        enforce(result, "gate.json")
    assert "\n" not in str(err.value)
    path = str(tmp_path / "gate.json")
    write_report(path, result)
    json.loads(open(path, encoding="utf-8").read(), parse_constant=lambda c: pytest.fail("not strict JSON: " + c))


def test_nan_never_passes_a_threshold(forty):
    """A candidate whose every output is NaN: the cosines are the worst there is, not NaN compared as passing."""
    finite = {n: np.linspace(-1, 1, 10, dtype=np.float32)[None] for n in forty.files}
    nan = {n: np.full((1, 10), np.nan, np.float32) for n in forty.files}
    s, (ref, cand) = by_image(forty, [finite, nan])
    r = evaluate(ref, cand, s, PreprocessConfig(resize=32, crop=32), GateConfig()).report
    assert r["verdict"] == "fail" and r["mean_cosine"] == r["p5_cosine"] == -1.0
    assert any(f.startswith("mean logit cosine -1.0000 < ") for f in r["failures"])


def test_near_uniform_fp32_outputs_are_untrained_weights_the_gate_cannot_judge(forty):
    flat = {n: np.full((1, 1000), 1e-10, np.float32) for n in forty.files}
    s, (ref, cand) = by_image(forty, [flat, flat])
    r = evaluate(ref, cand, s, PreprocessConfig(resize=32, crop=32), GateConfig()).report
    assert r["reference_near_uniform"] and r["verdict"] == "fail"
    assert any("near-uniform" in f and "--untrained" in f for f in r["failures"])


# --- what the gate judges besides the drop: the reference, the labels, every class -----------------------------

def with_classifier(src, dst, change):
    """A copy of `src` whose classifier (the last Gemm's weight rows and bias, one per class) `change(w, b)` edits."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(src)
    gemm = [n for n in model.graph.node if n.op_type == "Gemm"][-1]
    inits = {i.name: i for i in model.graph.initializer}
    w, b = (numpy_helper.to_array(inits[name]).copy() for name in gemm.input[1:3])
    w, b = change(w, b)
    for name, value in zip(gemm.input[1:3], (w, b)):
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
    onnx.save(model, dst)
    return dst


def test_a_model_at_chance_fails_before_int8_is_judged(digits, tmp_path):
    """The classifier rows in another class order (a network trained on another label order): FP32 is at chance, and a
    faithful INT8 of it (here: itself, 0 flips, the best drop claim there is) must not pass."""
    order = np.roll(np.arange(10), 3)
    permuted = with_classifier(digits.onnx, str(tmp_path / "permuted.onnx"), lambda w, b: (w[order], b[order]))
    with onnx_runner(permuted) as infer:
        result = evaluate(infer, infer, load_calibration_set(digits.regression), digits.preprocess, DIGITS_GATE,
                          LABELS)
    r = result.report
    assert r["reference_top1"] < 0.2 and r["top1_verdict"] == "pass" and r["verdict"] == "fail"
    assert r["failures"][0].startswith("FP32 reference top-1 ") and "below 50.0 % (5x chance" in r["failures"][0]
    with pytest.raises(EdgeError, match="^accuracy gate failed: FP32 reference top-1") as err:
        enforce(result, "gate.json")
    assert err.value.exit_code == 1


def test_the_reference_is_held_to_the_figure_its_model_info_records(digits, reference):
    s = load_calibration_set(digits.regression)
    judge = lambda info: evaluate(reference, reference, s, digits.preprocess, DIGITS_GATE, LABELS,  # noqa: E731
                                  source_info=info).report
    assert judge({"expected_top1": 0.97})["verdict"] == "pass"  # what it scores, within its interval
    r = judge({"expected_top1": 0.999})
    assert r["verdict"] == "fail" and "below the 99.9 % its model info records" in r["failures"][0]
    assert judge({"expected_top1": 0.999, "expected_top1_set": "0" * 64})["verdict"] == "pass"  # another set's


def test_permuted_labels_fail(digits, reference):
    """A labels file in another order than the model's classes: the class-name folders are filed under the wrong
    indices, so FP32 is 'wrong' on every one of them; and a 1000-line ImageNet list out of order is named."""
    shifted = LABELS[1:] + LABELS[:1]  # line i says str(i + 1): folder '3' is read as class 2
    r = evaluate(reference, reference, load_calibration_set(digits.regression), digits.preprocess, DIGITS_GATE,
                 shifted).report
    assert r["verdict"] == "fail" and r["reference_top1"] < 0.1
    assert any(f.startswith("labels look swapped: folder of class '") for f in r["failures"])


def test_a_collapsed_class_fails_naming_it(digits, digits_qdq, reference, tmp_path):
    """Five classifier rows cut 64x in the INT8 candidate (their classes can hardly win): named, label-free."""
    def cut(w, b):
        w[:5] /= 64.0
        return w, b

    collapsed = with_classifier(digits_qdq, str(tmp_path / "collapsed.onnx"), cut)
    with onnx_runner(collapsed) as candidate:
        r = evaluate(reference, candidate, load_calibration_set(digits.calibration), digits.preprocess,
                     GateConfig(min_agreement=0.0, min_mean_cosine=-1.0, min_p5_cosine=-1.0,
                                max_confident_flip_pct=100.0)).report  # unlabelled, every other threshold open
    assert r["labelled"] == 0 and r["verdict"] == "fail"
    assert [c["class"] for c in r["collapsed_classes"]] == [0, 1, 2, 3, 4]
    assert r["failures"] == [next(f for f in r["failures"] if f.startswith("5 classes collapsed in the candidate: "
                                                                           "0 (score spread x0.0"))]


def test_per_class_recall_is_reported_with_the_worst_class(digits, digits_qdq, reference):
    r = gate(digits, reference, digits_qdq).report
    assert r["collapsed_classes"] == [] and r["min_spread_ratio"] > 0.5
    assert sum(c["images"] for c in r["per_class"]) == 297 and len(r["per_class"]) == 10
    worst = r["worst_class"]
    assert worst == r["per_class"][0] and all(
        (c["candidate_right"] - c["reference_right"]) / c["images"] >=
        (worst["candidate_right"] - worst["reference_right"]) / worst["images"] for c in r["per_class"])


@pytest.mark.parametrize("folder", ["\u00b2", "\u2460", "\u0663"])
def test_a_folder_named_by_a_non_ascii_digit_is_one_line(digits, folder):
    s = load_calibration_set(digits.regression)
    odd = CalibrationSet(s.root, [folder + "/0001.png"], s.sha256)
    with pytest.raises(EdgeError, match="subfolder '{}' is neither a label".format(folder)):
        resolve_labels(odd, None)
    with pytest.raises(EdgeError, match="subfolder '{}' is neither a label".format(folder)):
        resolve_labels(odd, LABELS)


def test_a_folder_named_by_an_ambiguous_label_is_refused_naming_both_lines(digits):
    s = load_calibration_set(digits.regression)
    labels = ["bird"] * 10
    labels[2] = labels[7] = "crane"
    cranes = CalibrationSet(s.root, ["crane/0001.png"], s.sha256)
    with pytest.raises(EdgeError, match="folder 'crane' is ambiguous: lines 3 and 8 of the labels file all say it "
                                        r"\(class indices 2 and 7\)"):
        resolve_labels(cranes, labels)
