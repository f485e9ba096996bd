"""edge.bench.sweep_options: `edge sweep`'s options are declared once: the command line reads back what a caller
spells, and the regression thresholds are the check's own declarations (one default)."""

import argparse

from edge.bench.check import CheckOptions
from edge.bench.sweep_options import SweepOptions
from edge.cli import sweep
from edge.fields import as_argv, leaves, options_from


def test_check_and_sweep_share_one_regression_declaration():
    shared = ("regression_pct", "regression_ms")
    sweep, check = ({d: f for d, f, _ in leaves(cls) if d in shared} for cls in (SweepOptions, CheckOptions))
    assert all(sweep[d] is check[d] for d in shared)  # one declaration, one default
    assert SweepOptions().regression_ms == CheckOptions().regression_ms == 0.2


def test_the_sweep_options_the_command_line_gives_are_the_declared_ones():
    parser = argparse.ArgumentParser()
    sweep.add_arguments(parser)
    assert options_from(parser.parse_args([]), SweepOptions) == SweepOptions()
    wanted = SweepOptions(batch=[1, 8], streams=[3], load="closed", fail_on_regression=True, compare="old.json",
                          plot="", seed=7, regression_ms=0.0)
    assert options_from(parser.parse_args(as_argv(wanted)), SweepOptions) == wanted
