#!/usr/bin/env python3
"""Build the TensorRT engine on this device: `edge build --engine` with the same flags.

    python3 scripts/build_engine.py --config /etc/jetson-edge/edge.yaml [--calibrator] [--precision fp16]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edge.cli.build import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--engine"] + sys.argv[1:], prog="build_engine.py"))
