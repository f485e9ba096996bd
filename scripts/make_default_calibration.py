#!/usr/bin/env python3
"""Regenerate calibration/default and calibration/regression from scikit-image's sample photographs."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from edge.model.default_sets import make_default_sets  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="calibration", help="folder holding default/ and regression/")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make_default_sets(args.root, seed=args.seed)
