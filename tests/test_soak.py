"""Soak (slow, not in the default run): 20,000 frames through the daemon; memory, threads and files stay flat."""

import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))


@pytest.mark.slow
def test_20000_frames_without_leaks(small_model):
    import soak

    result = soak.soak(small_model, frames=20000, baseline_at=2000)
    print({k: v for k, v in result.items() if k != "samples"})
    assert result["frames"] == 20000 and result["errors"] == 0
    assert result["rss_growth_pct"] <= 5.0, result["samples"]
    assert result["threads"]["end"] <= result["threads"]["baseline"]
    assert result["fds"]["end"] <= result["fds"]["baseline"]
    assert result["scrapes"] >= 30 and result["notify"].get("WATCHDOG", 0) > 0 and result["notify"].get("READY") == 1
