"""What an engineer reads beside the gate's JSON report (<artifact>.gate.md), and `edge gate export-flips`, on a
gate report built from constructed outcomes: 40 labelled images of 4 classes, 4 of them flipped."""

import os

import numpy as np
import pytest
from test_gate import by_image, solid_colours

from edge.cli.main import main as edge
from edge.config import GateConfig, PreprocessConfig
from edge.model.calibration import load_calibration_set
from edge.model.gate import evaluate, resolve_labels, write_report
from edge.model.gate_report import markdown, summary_path, write_summary
from edge.model.gate_report import text as text_of

quiet = lambda *a: None  # noqa: E731
HOSTILE = "a|b <script>alert(1)</script>\nrow `x`"


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    return solid_colours(tmp_path_factory, "regression")


@pytest.fixture(scope="module")
def report(regression, tmp_path_factory):
    """The gate's report where the candidate turns the first 4 images' right answers wrong, written as a build
    writes it."""
    truth = {n: int(n.split("/")[0]) for n in regression.files}
    flipped = set(regression.files[:4])
    images, (reference, candidate) = by_image(regression, [
        {n: 10 * np.eye(4, dtype=np.float32)[(truth[n] + (1 if flip and n in flipped else 0)) % 4] for n in truth}
        for flip in (False, True)], manifest=True)
    result = evaluate(reference, candidate, images, PreprocessConfig(resize=32, crop=32),
                      GateConfig(min_agreement=0.0, min_mean_cosine=-1.0, min_p5_cosine=-1.0,
                                 max_confident_flip_pct=100.0, max_top1_drop_pp=50.0))
    path = str(tmp_path_factory.mktemp("engines") / "m.int8.gate.json")
    write_report(path, result, {"artifact": path.replace(".gate.json", ".onnx")})
    return path, dict(result.report, artifact=path.replace(".gate.json", ".onnx"))


def test_the_summary_beside_the_report_holds_the_claims_classes_and_flips(report):
    path, r = report
    write_summary(summary_path(path), r)
    assert summary_path(path).endswith("m.int8.gate.md")
    text = open(summary_path(path), encoding="utf-8").read()
    assert r["verdict"] == "pass" and "Verdict: **pass** at 95 %" in text
    assert "- " + text_of(r["top1_claim"]) in text and "top-1 drop &lt;= " in text_of(r["top1_claim"])
    assert "| 0 | 10 | 10 | 6 | -40.0 |" in text.split("## Per class")[1]  # the worst class first
    assert len(r["flips"]) == 4
    for f in r["flips"]:  # each flip: file, label, answers, both logit margins
        assert f["reference_margin"] == f["candidate_margin"] == 10.0
        assert "| {} | {} | {} | {} | 10.0 | 10.0 |".format(f["file"], f["label"], f["reference"],
                                                            f["candidate"]) in text


def test_a_hostile_file_name_or_label_stays_one_escaped_table_cell(report):
    _, r = report
    flip = dict(r["flips"][0], file=HOSTILE + ".png", label=HOSTILE)
    text = markdown(dict(r, flips=[flip], per_class=[dict(r["per_class"][0], **{"class": HOSTILE})]))
    assert "<" not in text and ">" not in text.replace("&gt;", "")  # no HTML can start
    escaped = "a\\|b &lt;script&gt;alert(1)&lt;/script&gt;\\u000arow \\`x\\`"
    row = [line for line in text.splitlines() if line.startswith("| " + escaped + ".png |")]
    assert len(row) == 1 and row[0].count(" | ") == 6  # still 7 cells: no | or line break got through
    assert row[0].split(" | ")[1] == escaped
    assert "| {} | 10 |".format(escaped) in text


def test_export_flips_makes_a_regression_set_the_next_gate_reads(report, regression, tmp_path, capsys):
    path, r = report
    out = str(tmp_path / "flips")
    assert edge(["gate", "export-flips", out, "--report", path]) == 0
    assert "4 flipped images (4 labelled)" in capsys.readouterr().out
    flips = load_calibration_set(out, what="regression set")
    assert flips.files == sorted(f["file"] for f in r["flips"])
    for name in flips.files:  # the same bytes, in the class folder the gate read
        assert open(os.path.join(out, name), "rb").read() == open(regression.path(name), "rb").read()
    assert resolve_labels(flips, None) == [int(n.split("/")[0]) for n in flips.files]
    again = str(tmp_path / "imported")  # and `edge calibrate import` takes it as an ImageFolder
    assert edge(["calibrate", "import", out, again, "--min-images", "1"]) == 0
    assert load_calibration_set(again).files == flips.files


def test_export_flips_refuses_bad_input_in_one_line_writing_nothing(report, regression, tmp_path, capsys):
    path, _ = report
    out = str(tmp_path / "flips")
    not_report = tmp_path / "not.json"
    not_report.write_text('{"verdict": "pass"}', encoding="utf-8")
    for argv, says in ((["--report", str(tmp_path / "none.gate.json")], "no gate report"),
                       (["--report", str(not_report)], "not a gate report"),
                       (["--model", str(tmp_path / "m.onnx")], "no gate report")):
        assert edge(["gate", "export-flips", out] + argv) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1
        assert not os.path.exists(out)
