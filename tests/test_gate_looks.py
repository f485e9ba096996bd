"""The ledger of looks: counted per source model and labelled set outside the artifact folder, refused after the
cap, never silently reset."""

import os
import stat

import pytest

from edge.errors import EdgeError
from edge.model.gate_looks import ledger_path, looks_taken, next_look, record_look
from edge.model.gate_stats import MAX_LOOKS, look_confidence


def test_twenty_looks_are_refused_after_the_cap_and_each_is_judged_wider(tmp_path):
    engines = tmp_path / "engines"
    path = ledger_path(str(engines), "a" * 64, "b" * 64)
    assert os.path.dirname(path) == str(tmp_path / "gate-looks")  # beside the engines folder, not in it
    confidences, refused = [], 0
    for attempt in range(20):
        try:
            look = next_look(path)
        except EdgeError as exc:
            assert exc.exit_code == 1 and "\n" not in str(exc)
            assert str(exc).startswith("accuracy gate refused: this model has had 10 looks at this regression set")
            assert "label a fresh set (build.regression_dir)" in str(exc)
            refused += 1
            continue
        confidences.append(look_confidence(look))
        record_look(path, {"verdict": "inconclusive", "accept_inconclusive": attempt % 2 == 0})
    assert len(confidences) == MAX_LOOKS == 10 and refused == 10
    assert confidences == sorted(confidences) and len(set(confidences)) == 10
    assert len(looks_taken(path)) == 10 and all("at" in look for look in looks_taken(path))
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert next_look(ledger_path(str(engines), "a" * 64, "c" * 64)) == 1  # a fresh set starts again
    assert next_look(ledger_path(str(engines), "d" * 64, "b" * 64)) == 1  # so does another model


def test_an_unreadable_ledger_is_one_line_never_a_reset(tmp_path):
    path = ledger_path(str(tmp_path / "engines"), "a" * 64, "b" * 64)
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"looks": 3}')
    with pytest.raises(EdgeError, match="gate look ledger must be a JSON object with a list 'looks'"):
        next_look(path)


def a_report(b, c, drop):
    return {"look": 1, "verdict": "pass", "regression_sha256": "b" * 64, "labelled": 100, "right_to_wrong": b,
            "wrong_to_right": c, "top1_drop_pp": drop, "mean_cosine": 0.99, "p5_cosine": 0.97, "flips": [],
            "per_class": [{"class": "cat", "images": 10, "reference_right": 9, "candidate_right": 7},
                          {"class": "dog", "images": 10, "reference_right": 8, "candidate_right": 8}],
            "collapsed_classes": [], "strata": [{"stratum": "upscaled", "labelled": 80, "right_to_wrong": b,
                                                 "wrong_to_right": c, "top1_drop_pp": drop, "images": 80}]}


def test_the_history_keeps_each_builds_figures_per_source_and_shows_the_last(tmp_path, capsys):
    from edge.cli.main import main as edge
    from edge.model.gate_looks import history_entry, history_path, read_history, record_history
    from edge.store.artifact import sha256_file

    model = tmp_path / "m.onnx"
    model.write_bytes(b"not really onnx")
    engines = tmp_path / "engines"
    path = history_path(str(engines), sha256_file(str(model)))
    assert os.path.dirname(path) == str(tmp_path / "gate-looks") and read_history(path) == []
    for b in range(3):
        history = record_history(path, history_entry(a_report(b, 1, b - 1.0), "m.int8.onnx (onnx-qdq candidate)"))
    assert len(history) == 3 == len(read_history(path)) and len(open(path, encoding="utf-8").readlines()) == 3
    last = read_history(path)[-1]
    assert (last["right_to_wrong"], last["wrong_to_right"], last["top1_drop_pp"], last["mean_cosine"]) == (2, 1, 1.0,
                                                                                                          0.99)
    assert [c["class"] for c in last["classes_changed"]] == ["cat"] and last["strata"][0]["stratum"] == "upscaled"
    assert "flips" not in last and "at" in last
    (tmp_path / "edge.yaml").write_text("model: {{path: {}}}\nbuild: {{engines_dir: {}}}\n".format(model, engines),
                                        encoding="utf-8")
    assert edge(["gate", "history", "--config", str(tmp_path / "edge.yaml"), "--last", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| at | candidate | verdict | labelled | b | c | drop (pp)") and len(out) == 2 + 2 + 1
    assert "| 2 | 1 | 1.0 |" in out[-2] and "cat -2" in out[-2]


def test_an_unreadable_history_line_is_one_line_naming_it(tmp_path):
    from edge.model.gate_looks import history_path, record_history

    path = history_path(str(tmp_path / "engines"), "a" * 64)
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"verdict": "pass"}\n[1]\n')
    with pytest.raises(EdgeError, match=r"a{64}\.history\.jsonl:2: the gate history's lines must be JSON objects"):
        record_history(path, {"verdict": "fail"})
    assert open(path, encoding="utf-8").read() == '{"verdict": "pass"}\n[1]\n'  # never rewritten from a bad read
