"""edge.bench.check_report: a comparison with a previous report flags a stage only past both thresholds (the percent
and the milliseconds), and a file that is no check report is refused."""

import pytest

from edge.bench import check, check_report
from edge.errors import EdgeError


def test_compare_needs_both_thresholds():
    current = {"a": {"p50": 1.15, "p99": 2.3}, "b": {"p50": 10.5, "p99": 0.5}}
    previous = {"stages_ms": {"a": {"p50": 1.0, "p99": 2.0}, "b": {"p50": 10.0, "p99": 0.0}}}
    defaults = check.CheckOptions()  # 10 % and 0.2 ms
    result = check_report.compare(current, previous, "prev.json", pct=defaults.regression_pct,
                                  ms=defaults.regression_ms)
    assert not result["stages"]["a"]["p50"]["regressed"]  # +15 % but only +0.15 ms
    assert result["stages"]["a"]["p99"]["regressed"]  # +15 % and +0.3 ms
    assert not result["stages"]["b"]["p50"]["regressed"]  # +0.5 ms but only +5 %
    assert result["stages"]["b"]["p99"]["regressed"] and result["stages"]["b"]["p99"]["delta_pct"] is None
    assert len(result["regressions"]) == 2


def test_compare_refuses_a_file_that_is_not_a_report(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"frames": 3}', encoding="utf-8")
    with pytest.raises(EdgeError, match="not an edge check report"):
        check_report.load_previous(str(bad))
