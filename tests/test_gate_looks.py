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
