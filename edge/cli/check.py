"""`edge check`: the on-device latency check, a trtexec-style summary of the real pipeline against the budget.

    edge check --config /etc/jetson-edge/config.yaml --frames 1000 --json check.json --plot check.png

Warm-up, then N timed frames through the same Runtime `edge run` uses (source -> preprocess -> infer ->
postprocess), per-stage p50/p90/p99/max/mean, budget misses and a verdict: PASS when the p99 of
end_to_end (capture -> result) is within `runtime.budget_ms`. Exit 0 pass, 1 fail, 2 could not run.
Writes a JSON report (docs/latency-check.md) and a 1200x900 figure (histogram, per-frame
stacked stages, telemetry traces). `--compare previous.json` flags per-stage p50/p99 regressions.
"""

import argparse
import sys
from typing import Any, Optional, Sequence

from edge.bench.check import CheckOptions, run_check, verdict
from edge.cli.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.errors import EXIT_FAIL, EXIT_OK
from edge.fields import add_flags, leaves, options_from


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)
    add_flags(p, CheckOptions, *(dotted for dotted, _, _ in leaves(CheckOptions)))


def register(subparsers: Any) -> None:
    add_command(subparsers, "check", "latency check: N frames through the pipeline against the budget",
                __doc__, add_arguments, cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    options = options_from(args, CheckOptions)
    report = run_check(config_from_args(args, serves_cameras=True), options,
                       out=lambda s: print(s, flush=True), warn=lambda s: print("edge check: " + s, file=sys.stderr))
    if not verdict(report, options.json or "the report").passed:
        return EXIT_FAIL
    if options.fail_on_regression and report["comparison"] and report["comparison"]["regressions"]:
        return EXIT_FAIL
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge check") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_check, argv)
