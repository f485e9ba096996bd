#!/usr/bin/env python3
"""Camera demo: classify a live camera, drawing top-5, stage times, FPS and the budget (green/red) on each frame.

    scripts/camera_demo.py --source csi://0                               # OpenCV window on the Jetson's desktop
    scripts/camera_demo.py --source /dev/video0 --headless --port 8080    # then open http://127.0.0.1:8080/
    ssh -L 8080:127.0.0.1:8080 user@jetson                                # ... from your laptop through a tunnel

Same as `edge demo` (docs/demo.md). Ctrl-C (or q/Esc in the window) stops it and prints the latency table.
"""

import sys

from edge.cli.demo import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="camera_demo.py"))
