"""The `edge` command: one subcommand per use, each registered by its own module in edge/cli/."""

import argparse
import importlib
import sys
from typing import List, Optional

from edge import __version__
from edge.cli.common import execute

# modules in edge/cli/
COMMANDS = ("run", "export", "model", "build", "check", "sweep", "rebuild", "demo", "classify", "doctor", "cache",
            "init", "release", "gate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge", description=__doc__)
    parser.add_argument("--version", action="version", version="jetson-edge " + __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module("edge.cli." + name).register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    try:
        parser = build_parser()  # imports every command module: a Ctrl-C may land here
    except KeyboardInterrupt:
        print("edge: interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    return execute("edge " + args.command, args.func, args)
