"""`edge demo`: the camera with top-5 labels, per-stage milliseconds, FPS and a green/red budget box drawn on it.

    edge demo --source csi://0                          # an OpenCV window (needs an OpenCV with a GUI)
    edge demo --source /dev/video0 --headless --port 8080
        http://127.0.0.1:8080/             status page: the stream and live numbers
        http://127.0.0.1:8080/stream.mjpg  the annotated stream (MJPEG, multipart/x-mixed-replace)
        http://127.0.0.1:8080/stats.json   the numbers the overlay shows
        http://127.0.0.1:8080/frame.jpg    one annotated frame

The server listens on 127.0.0.1 unless --host says otherwise; watch from another machine through an SSH
tunnel (ssh -L 8080:127.0.0.1:8080 user@jetson). The overlay is drawn by a Sink after each frame's timing
is complete; each frame is JPEG-encoded at most once, and only while a client waits for it (or once a
second for /frame.jpg), then the same bytes go to every client (edge/service/demo_stream.py). See docs/demo.md.
"""

import argparse
import os
import re
import sys
import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

from edge.cli.common import PIPELINE_KEYS, add_command, add_config_flags, config_from_args, standalone_main
from edge.config import Config, with_overrides
from edge.errors import EXIT_OK, EdgeError, require
from edge.fields import add_flags, check_options, leaves, options_from, setting
from edge.store.model_info import UNTRAINED_WARNING, read_model_info
from edge.uri import redact


def gui_problem(cv2: Any) -> Optional[str]:
    """None when cv2.imshow can open a window here, else why not."""
    info = cv2.getBuildInformation()
    match = re.search(r"^\s*GUI:\s*(\S+)", info, re.M)
    has_gui = (match.group(1).upper() != "NONE") if match else bool(
        re.search(r"^\s*(GTK\+( 2\.x| 3\.x)?|QT|Win32 UI|Cocoa):\s*YES", info, re.M))
    if not has_gui:
        return "this OpenCV ({}) has no GUI (pip's opencv-python-headless)".format(cv2.__version__)
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return "no display (DISPLAY is not set)"
    return None


@dataclass(frozen=True)
class DemoOptions:
    """`edge demo`'s own flags with their defaults and bounds, declared once (edge.fields)."""

    headless: bool = setting(False, "no window: serve the annotated stream over HTTP", flag="--headless")
    host: str = setting("127.0.0.1", "address to listen on (127.0.0.1: this machine only)", flag="--host")
    port: int = setting(8080, "port for --headless (0: a free one)", low=0, high=65535, flag="--port")
    jpeg_quality: int = setting(80, "JPEG quality of the stream", low=1, high=100, flag="--jpeg-quality")


def run_demo(cfg: Config, options: DemoOptions, log: Any = None) -> Dict[str, Any]:
    """Run the pipeline with the overlay until stopped (Ctrl-C, SIGTERM, q/Esc in the window), runtime.frames, or
    the source's end; returns the final latency report."""
    from edge.service.demo_stream import FrameHub, OverlaySink, open_server  # the frame path: loaded when run
    from edge.service.loop import run
    from edge.service.runtime import Runtime
    from edge.service.signals import StopFlag

    cv2: Any = require("cv2")
    if not options.headless:
        problem = gui_problem(cv2)
        if problem:
            raise EdgeError("{}: run with --headless --port 8080 and open http://127.0.0.1:8080/ "
                            "(docs/demo.md)".format(problem))
    check_options(options)
    cfg = with_overrides(cfg, {"service.metrics.enabled": False})  # the service may hold the port
    trained = bool(read_model_info(cfg.model.path).get("trained"))
    hub = FrameHub({"warning": None if trained else UNTRAINED_WARNING, "source": redact(cfg.source.uri),
                    "budget_ms": cfg.runtime.budget_ms}) if options.headless else None
    server = open_server(options.host, options.port, hub) if hub is not None else None
    try:
        with StopFlag() as stop:  # Ctrl-C, SIGTERM: the report, then exit 0
            sink = OverlaySink(cfg.runtime.budget_ms, trained, hub, window=not options.headless,
                               jpeg_quality=options.jpeg_quality, stop=stop,
                               on_first_frame=lambda: _announce(server, runtime))
            runtime = Runtime(cfg, [sink], log)
            if server is not None:
                threading.Thread(target=server.serve_forever, name="edge-demo-http", daemon=True).start()
            report = run(runtime, stop, table="edge demo")
        if hub is not None:
            report["jpegs_encoded"] = hub.encoded
        return report
    finally:
        if hub is not None:
            hub.close()
        if server is not None:
            server.shutdown()
            server.server_close()


def _announce(server: Any, runtime: Any) -> None:
    if server is None:  # a window: nothing to announce
        return
    bound_host, bound_port = server.server_address[:2]
    url = "http://{}:{}/".format(bound_host, bound_port)
    runtime.event("serving", url=url, stream=url + "stream.mjpg", stats=url + "stats.json")
    print("edge demo: open {} (stream {}stream.mjpg){}".format(
        url, url, "" if bound_host in ("127.0.0.1", "localhost", "::1") else
        "; WARNING: listening beyond this machine, anyone who can reach it can watch"), file=sys.stderr, flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, *PIPELINE_KEYS, "runtime.frames")
    add_flags(p, DemoOptions, *(dotted for dotted, _, _ in leaves(DemoOptions)))


def register(subparsers: Any) -> None:
    add_command(subparsers, "demo", "camera demo: top-5, stage times, FPS, budget on the frame (window/MJPEG)",
                       __doc__, add_arguments, cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    run_demo(config_from_args(args, serves_cameras=True), options_from(args, DemoOptions))
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge demo") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_demo, argv)
