#!/usr/bin/env python3
"""Top-k classes for image files or folders, through the runtime's own preprocessing and backend.

    scripts/classify.py photo.jpg holiday/ --model engines/efficientnet_lite0.onnx
    scripts/classify.py calibration/regression --json > predictions.jsonl

Same as `edge classify`. Unreadable images are named and skipped; exit 2 when none could be read.
"""

import sys

from edge.cli.classify import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="classify.py"))
