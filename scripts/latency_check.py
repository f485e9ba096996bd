#!/usr/bin/env python3
"""On-device latency check: warm up, time N frames through the real pipeline, judge p99 against the budget.

    scripts/latency_check.py --config /etc/jetson-edge/config.yaml --frames 1000
    scripts/latency_check.py --source synthetic --model engines/mobilenet_v3_large.engine --budget-ms 30 \\
        --json check.json --plot check.png --compare previous.json

Same as `edge check` (docs/latency-check.md). Exit 0: p99 within budget, 1: over budget, 2: could not run.
"""

import sys

from edge.cli.check import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="latency_check.py"))
