"""`edge run`: the classifier as a foreground command or a systemd service (edge/service/loop.py)."""

import argparse
from typing import Any

from edge.commands.common import add_command, add_config_flags, config_from_args
from edge.errors import EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)
    p.add_argument("--frames", type=int, help="runtime.frames: stop after N timed frames (0: until stopped)")


def cmd_run(args: argparse.Namespace) -> int:
    from edge.service.loop import run

    extra = {"runtime.frames": args.frames}
    # SIGHUP re-reads the config file and re-applies the same flags.
    run(config_from_args(args, extra), reload_config=lambda: config_from_args(args, extra), table="edge run")
    return EXIT_OK


def register(subparsers: Any) -> None:
    add_command(subparsers, "run", "run the camera -> preprocess -> infer -> postprocess loop", __doc__,
                add_arguments, cmd_run)
