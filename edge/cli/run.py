"""`edge run`: the classifier as a foreground command or a systemd service (edge/service/loop.py).

On stdout, JSON lines: the start, a summary every runtime.report_every frames (with the classes most often top-1),
errors, source and reload events, and the report; each missed frame's `frame_miss` line only with --json or under
systemd (the journal). Then the per-stage table on stderr, ending with what it classified. Every frame's result
for another program: service.results.path (docs/service.md#results)."""

import argparse
from dataclasses import dataclass
from typing import Any

from edge.cli.common import PIPELINE_KEYS, add_command, add_config_flags, config_from_args
from edge.errors import EXIT_OK
from edge.fields import add_flags, options_from, setting
from edge.service.signals import StopFlag  # light: signal and threading only


@dataclass(frozen=True)
class RunOptions:
    """`edge run`'s own flag, declared once (edge.fields)."""

    json: bool = setting(False, "every event as a JSON line on stdout, each missed frame's frame_miss too (always so "
                                "under systemd, where stdout is the journal); without it: the start, a summary per "
                                "runtime.report_every frames, errors and the report, then the table on stderr",
                         flag="--json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, *PIPELINE_KEYS, "runtime.frames")
    add_flags(p, RunOptions, "json")


def cmd_run(args: argparse.Namespace) -> int:
    with StopFlag() as stop:  # first, before anything slow: a SIGHUP or SIGTERM while starting is noted, not fatal
        from edge.service.log import JsonLog
        from edge.service.loop import run
        from edge.service.runtime import Runtime

        # SIGHUP re-reads the config file and re-applies the same flags.
        runtime = Runtime(config_from_args(args, serves_cameras=True),
                          log=JsonLog(quiet=() if options_from(args, RunOptions).json else ("frame_miss",)),
                          reload_config=lambda: config_from_args(args, serves_cameras=True))
        run(runtime, stop, table="edge run")
    return EXIT_OK


def register(subparsers: Any) -> None:
    add_command(subparsers, "run", "run the camera -> preprocess -> infer -> postprocess loop", __doc__,
                add_arguments, cmd_run, hangup_reloads=True)
