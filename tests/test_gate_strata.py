"""The gate by kind of image: a set of upscaled thumbnails and full-size photos, INT8 damaging only the photos: the
report's table and claim name the stratum, and a stratum beyond the limit on its own fails the build."""

import numpy as np
import pytest
from test_gate import by_image

from edge.config import GateConfig, PreprocessConfig
from edge.model.calibration import CalibrationSet, import_calibration_set
from edge.model.gate import evaluate
from edge.model.gate_report import markdown
from edge.model.gate_strata import FULL, UPSCALED, stratum_names

quiet = lambda *a: None  # noqa: E731
PREPROCESS = PreprocessConfig(resize=64, crop=64)


@pytest.fixture(scope="module")
def two_kinds(tmp_path_factory):
    """120 labelled images in class folders 0-3: 80 of 32 px (upscaled to 64) and 40 of 96 px (full size)."""
    import cv2

    raw = tmp_path_factory.mktemp("two-kinds-raw")
    for i in range(120):
        (raw / str(i % 4)).mkdir(exist_ok=True)
        side = 32 if i < 80 else 96
        cv2.imwrite(str(raw / str(i % 4) / "{:03d}.png".format(i)), np.full((side, side, 3), 2 * i, np.uint8))
    return import_calibration_set(str(raw), str(tmp_path_factory.mktemp("sets") / "two"), min_images=1, log=quiet)


def judge(images, damaged, limit):
    """FP32 right on every image; the candidate wrong on `damaged` (file names)."""
    truth = {n: int(n.split("/")[0]) for n in images.files}
    answers = [{n: (truth[n] + 5 * (damage and n in damaged)) % 10 for n in truth} for damage in (False, True)]
    s, (ref, cand) = by_image(images, [{n: 10 * np.eye(10, dtype=np.float32)[None, k] for n, k in a.items()}
                                       for a in answers], manifest=True)
    return evaluate(ref, cand, s, PREPROCESS, GateConfig(
        min_agreement=0.0, min_mean_cosine=-1.0, min_p5_cosine=-1.0, max_confident_flip_pct=100.0,
        max_top1_drop_pp=limit)).report


def test_strata_come_from_the_sizes_the_manifest_records(two_kinds):
    names = stratum_names(two_kinds, PREPROCESS.resize)
    assert names.count(UPSCALED) == 80 and names.count(FULL) == 40
    assert stratum_names(CalibrationSet(two_kinds.root, two_kinds.files, two_kinds.sha256), 64) is None


def test_int8_damaging_only_the_photos_is_named_and_fails_on_them_alone(two_kinds):
    photos = [n for n in two_kinds.files if int(n.split("/")[1][:3]) >= 80]
    r = judge(two_kinds, set(photos[:12]), limit=5.0)
    rows = {row["stratum"]: row for row in r["strata"]}
    assert (rows[UPSCALED]["right_to_wrong"], rows[FULL]["right_to_wrong"]) == (0, 12)
    assert rows[FULL]["top1_drop_pp"] == 30.0 and rows[UPSCALED]["top1_drop_pp"] == 0.0
    assert rows[FULL]["beyond_limit"] and not rows[UPSCALED]["beyond_limit"]
    assert "rests on 40 full size images (FP32 100.0 %; 12 turned wrong, 0 right), 80 upscaled images" \
        in r["top1_claim"]
    assert r["verdict"] == "fail" and any(f.startswith("on the 40 full size images alone the top-1 drop is >= ")
                                          for f in r["failures"])
    md = markdown(r)
    assert "## By kind of image" in md and "| full size | 40 | 40 | 12 |" in md


def test_a_stratum_within_the_limit_stays_descriptive(two_kinds):
    photos = [n for n in two_kinds.files if int(n.split("/")[1][:3]) >= 80]
    r = judge(two_kinds, set(photos[:1]), limit=20.0)
    assert r["verdict"] == "pass" and not r.get("strata_failure")
    assert r["strata_confidence"] == 0.975 and len(r["strata"]) == 2
