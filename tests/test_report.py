"""edge.bench.report: the one schema version, previous-report reader and regression rule of `edge check` and
`edge sweep`."""

import json

import pytest

from edge.bench import report
from edge.errors import EdgeError


@pytest.mark.parametrize("was,now,higher_is_worse,regressed", [
    (10.0, 11.5, True, True),    # +1.5 ms and +15 %: both over (10 %, 0.2 ms)
    (10.0, 10.9, True, False),   # +9 %: under the percentage
    (1.0, 1.15, True, False),    # +15 % but +0.15 ms: under the milliseconds
    (100.0, 85.0, False, True),  # a rate down 15 %
    (100.0, 95.0, False, False),
    (0.0, 0.5, True, True),      # from zero: only the milliseconds can judge
])
def test_one_rule_judges_times_and_rates(was, now, higher_is_worse, regressed):
    entry, worse = report.judge(was, now, pct=10.0, ms=0.2, higher_is_worse=higher_is_worse)
    assert worse is regressed and entry["regressed"] is regressed
    assert ("delta_ms" in entry) is higher_is_worse


@pytest.mark.parametrize("value", ["3", True, float("nan"), float("inf"), [1], {"a": 1}, None, 10 ** 400])
def test_anything_but_a_finite_number_is_not_compared(value):
    assert report.judge(value, 1.0, pct=10.0, ms=0.2) is None and report.judge(1.0, value, pct=10.0, ms=0.2) is None


def test_a_previous_report_of_another_kind_or_version_is_one_line(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": report.SCHEMA_VERSION, "cells": []}), encoding="utf-8")
    assert report.load_previous(str(path), tool="edge sweep", rows="cells")["cells"] == []
    with pytest.raises(EdgeError, match="not an edge check report \\(no 'stages_ms'\\)"):
        report.load_previous(str(path), tool="edge check", rows="stages_ms")
    path.write_text(json.dumps({"schema_version": 99, "cells": []}), encoding="utf-8")
    with pytest.raises(EdgeError, match="schema_version 99, this edge sweep reads 1"):
        report.load_previous(str(path), tool="edge sweep", rows="cells")
    path.write_text(json.dumps({"schema_version": 1, "cells": [{"x": 1}]}), encoding="utf-8")
    seen = []
    report.load_previous(str(path), tool="edge sweep", rows="cells", check_row=lambda *a: seen.append(a))
    assert seen == [(str(path), "cells[0]", {"x": 1})]
