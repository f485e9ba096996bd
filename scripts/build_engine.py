#!/usr/bin/env python3
"""Build the TensorRT engine on this device: `edge build --engine` with the same flags.

    python3 scripts/build_engine.py --config /etc/jetson-edge/edge.yaml [--calibrator] [--precision fp16]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edge.build.steps import add_build_parser  # noqa: E402
from edge.errors import EdgeError  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="build_engine.py")
    add_build_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["build", "--engine"] + sys.argv[1:])
    try:
        sys.exit(args.func(args))
    except EdgeError as exc:
        print("build_engine: error: {}".format(exc), file=sys.stderr)
        sys.exit(exc.exit_code)
