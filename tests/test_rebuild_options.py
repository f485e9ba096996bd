"""edge.model.rebuild_options: the rebuild's latency check takes the check's own bounds (one declaration), and its
source is a well-formed URI or empty, refused in one line naming the flag."""

import pytest

from edge.bench.check import CheckOptions
from edge.errors import EdgeError
from edge.fields import check_options, declared_range
from edge.model.rebuild_options import RebuildOptions


def test_the_latency_checks_bounds_are_the_checks_own():
    assert declared_range(RebuildOptions, "check_frames") == declared_range(CheckOptions, "frames")
    assert declared_range(RebuildOptions, "check_warmup") == declared_range(CheckOptions, "warmup")
    low, high = declared_range(CheckOptions, "frames")
    with pytest.raises(EdgeError, match="^--check-frames must be between"):
        check_options(RebuildOptions(check_frames=high + 1))
    check_options(RebuildOptions(check_frames=low))


def test_the_check_source_is_empty_or_a_well_formed_uri():
    check_options(RebuildOptions(check_source=""))
    check_options(RebuildOptions(check_source="synthetic"))
    with pytest.raises(EdgeError, match="csi://N"):
        check_options(RebuildOptions(check_source="csi://front"))
