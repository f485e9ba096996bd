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
second for /frame.jpg), then the same bytes go to every client. See docs/demo.md.
"""

import argparse
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import numpy as np

from edge.commands.common import add_command, add_config_flags, config_from_args, standalone_main
from edge.config import Config, with_overrides
from edge.errors import EXIT_OK, EdgeError, require
from edge.frame.pipeline import Result, Sink
from edge.modelinfo import UNTRAINED_WARNING, read_model_info
from edge.service.loop import frames_done, run
from edge.service.runtime import Runtime

BOUNDARY = "frame"
SNAPSHOT_MAX_AGE_S = 1.0  # with nobody streaming, frames are still encoded this often for /frame.jpg
CLIENT_TIMEOUT_S = 10.0  # an idle (or slowloris) client is dropped after this long without progress
MAX_CLIENTS = 32  # concurrent connections, each a thread; more are refused with 503
WINDOW = "jetson-edge demo"


class FrameHub:
    """The latest annotated JPEG and stats, shared by the frame loop (writer) and HTTP clients (readers)."""

    def __init__(self, info: Optional[Dict[str, Any]] = None) -> None:
        self.info = dict(info or {})  # fixed facts every stats answer carries (warning, source)
        self._cond = threading.Condition()
        self.jpeg: Optional[bytes] = None
        self.jpeg_seq = 0
        self.jpeg_at = 0.0
        self.stats: Dict[str, Any] = {"frame": 0, "status": "starting"}
        self.waiting = 0  # clients blocked until the next JPEG
        self.streams = 0  # open /stream.mjpg connections
        self.encoded = 0
        self.refused = 0  # connections turned away beyond MAX_CLIENTS
        self.closed = False

    def wants_jpeg(self) -> bool:
        with self._cond:
            return self.waiting > 0 or self.jpeg is None or time.monotonic() - self.jpeg_at > SNAPSHOT_MAX_AGE_S

    def publish(self, jpeg: Optional[bytes], stats: Dict[str, Any]) -> None:
        with self._cond:
            if jpeg is not None:
                self.jpeg, self.jpeg_at = jpeg, time.monotonic()
                self.jpeg_seq += 1
                self.encoded += 1
            self.stats = stats
            self._cond.notify_all()

    def next_jpeg(self, after: int, timeout_s: float = 5.0) -> Tuple[int, Optional[bytes]]:
        """(seq, bytes) of the first JPEG newer than `after`; (after, None) on timeout or close."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self.waiting += 1
            try:
                while self.jpeg_seq <= after and not self.closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return after, None
                    self._cond.wait(remaining)
                if self.jpeg_seq <= after:
                    return after, None
                return self.jpeg_seq, self.jpeg
            finally:
                self.waiting -= 1

    def snapshot(self) -> Dict[str, Any]:
        with self._cond:
            return dict(self.info, **dict(self.stats, clients=self.streams, clients_refused=self.refused,
                                          jpegs_encoded=self.encoded))

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class OverlaySink(Sink):
    """Draws the overlay on each result; shows it in a window and/or publishes it to a FrameHub."""

    def __init__(self, budget_ms: float, trained: bool, hub: Optional[FrameHub] = None, window: bool = False,
                 jpeg_quality: int = 80):
        from edge.commands.overlay import FpsMeter

        self.budget_ms = budget_ms
        self.trained = trained
        self.hub = hub
        self.window = window
        self.jpeg_quality = jpeg_quality
        self.fps = FpsMeter()
        self.recorder: Any = None
        self.quit = False
        self.last: Optional[np.ndarray] = None

    def on_result(self, result: Result) -> None:
        from edge.commands.overlay import draw_overlay, stats_of

        cv2: Any = require("cv2")
        fps = self.fps.tick()
        annotated = draw_overlay(result.image, result, self.budget_ms, fps, self.trained)
        self.last = annotated
        if self.window:
            cv2.imshow(WINDOW, annotated)
            if cv2.waitKey(1) & 0xFF in (27, ord("q")):
                self.quit = True
        if self.hub is not None:
            stats = stats_of(result, self.budget_ms, fps)
            if self.recorder is not None:
                frames, misses = self.recorder.frames, self.recorder.misses
                stats.update(frames=frames, misses=misses, miss_rate=round(misses / frames, 5) if frames else 0.0)
            jpeg = None
            if self.hub.wants_jpeg():  # once per frame at most, and only when someone will get it
                ok, buf = cv2.imencode(".jpg", annotated, [cv2.IMWRITE_JPEG_QUALITY, self.jpeg_quality])
                jpeg = buf.tobytes() if ok else None
            self.hub.publish(jpeg, stats)

    def close(self) -> None:
        if self.window:
            require("cv2").destroyAllWindows()


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>jetson-edge demo</title>
<style>
body {{ background: #111; color: #ddd; font: 14px/1.4 sans-serif; margin: 12px; }}
#warn {{ color: #111; background: #ffa500; padding: 4px 8px; display: {warn_display}; }}
img {{ display: block; max-width: 100%; margin: 8px 0; background: #000; }}
td {{ padding: 1px 10px 1px 0; }} .ok {{ color: #3c3; }} .miss {{ color: #f44; }}
</style></head>
<body>
<div id="warn">{warning}</div>
<img id="stream" src="/stream.mjpg" {size} alt="annotated camera stream">
<table><tbody id="stats"><tr><td>waiting for frames...</td></tr></tbody></table>
<script>
function row(k, v, cls) {{ return '<tr><td>' + k + '</td><td class="' + (cls || '') + '">' + v + '</td></tr>'; }}
function update() {{
  fetch('/stats.json', {{cache: 'no-store'}}).then(function (r) {{ return r.json(); }}).then(function (s) {{
    var html = row('frame', s.frame) + row('FPS', s.fps);
    if (s.stage_ms) {{
      html += row('end_to_end', (s.stage_ms.end_to_end || 0).toFixed(2) + ' ms (budget ' + s.budget_ms + ' ms)',
                  s.within_budget ? 'ok' : 'miss');
      ['preprocess', 'infer', 'postprocess'].forEach(function (k) {{
        if (k in s.stage_ms) html += row(k, s.stage_ms[k].toFixed(2) + ' ms'); }});
    }}
    if (s.frames) html += row('misses', s.misses + ' of ' + s.frames);
    (s.top || []).forEach(function (t) {{ html += row((100 * t.score).toFixed(1) + '%', t.label); }});
    document.getElementById('stats').innerHTML = html;
  }}).catch(function () {{}});
}}
update(); setInterval(update, 500);
</script>
</body></html>
"""


class _Handler(BaseHTTPRequestHandler):
    server_version = "jetson-edge-demo"
    timeout = CLIENT_TIMEOUT_S  # a client that sends or reads nothing for this long is disconnected

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        hub: FrameHub = self.server.hub  # type: ignore[attr-defined]
        path = urlsplit(self.path).path
        if path in ("/", "/index.html"):
            stats = hub.snapshot()
            size = stats.get("size")  # known once the first frame is out
            warning = stats.get("warning") or ""
            page = PAGE.format(size='width="{}" height="{}"'.format(*size) if size else "", warning=warning,
                               warn_display="block" if warning else "none")
            self._send(200, "text/html; charset=utf-8", page.encode("utf-8"))
        elif path == "/stats.json":
            self._send(200, "application/json", json.dumps(hub.snapshot()).encode("utf-8"))
        elif path == "/frame.jpg":
            seq, jpeg = hub.next_jpeg(0 if hub.jpeg is None else hub.jpeg_seq - 1)
            if jpeg is None:
                self._send(503, "text/plain", b"no frame yet\n")
            else:
                self._send(200, "image/jpeg", jpeg)
        elif path == "/stream.mjpg":
            self._stream(hub)
        else:
            self._send(404, "text/plain", b"not found: / /stream.mjpg /stats.json /frame.jpg\n")

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, hub: FrameHub) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=" + BOUNDARY)
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        with hub._cond:
            hub.streams += 1
        seq = 0
        try:
            while not hub.closed:
                seq, jpeg = hub.next_jpeg(seq)
                if jpeg is None:
                    continue
                self.wfile.write("--{}\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n".format(
                    BOUNDARY, len(jpeg)).encode("ascii") + jpeg + b"\r\n")
                self.wfile.flush()
        except OSError:
            pass  # the client went away or stopped reading (socket.timeout is an OSError on 3.8 too)
        finally:
            with hub._cond:
                hub.streams -= 1

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (http.server's signature)
        pass  # one line per request would drown the log; the status page shows the client count


class _Server(ThreadingHTTPServer):
    """At most MAX_CLIENTS connections (one thread each); more are answered 503 and closed at once. A client
    that leaves early is not an error: no traceback, and one stderr line only for unexpected failures."""

    daemon_threads = True
    request_queue_size = 2 * MAX_CLIENTS  # a burst waits in the kernel's accept queue in order, not in SYN retries

    def __init__(self, address: Tuple[str, int], hub: FrameHub) -> None:
        super().__init__(address, _Handler)
        self.hub = hub
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.hub.refused += 1
            if self.hub.refused == 1:
                print("edge demo: {} clients connected; refusing more (counted in stats.json)".format(MAX_CLIENTS),
                      file=sys.stderr, flush=True)
            try:
                request.setblocking(False)
                request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):  # a dropped connection is normal; anything else gets one line
            print("edge demo: client {}: {}: {}".format(client_address[0], type(exc).__name__, exc),
                  file=sys.stderr, flush=True)


def open_server(host: str, port: int, hub: FrameHub) -> ThreadingHTTPServer:
    """Bind now (a taken port is an input error, found before the pipeline starts); serve later."""
    try:
        return _Server((host, port), hub)
    except OSError as exc:
        raise EdgeError("{}:{}: cannot listen: {} (pick another --port, or 0 for a free one)".format(
            host, port, exc.strerror or exc)) from None


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


def run_demo(cfg: Config, headless: bool, host: str = "127.0.0.1", port: int = 8080, frames: int = 0,
             jpeg_quality: int = 80, log: Any = None) -> Dict[str, Any]:
    """Run the pipeline with the overlay until stopped (Ctrl-C, SIGTERM, q/Esc in the window), `frames`, or the
    source's end; returns the final latency report."""
    cv2: Any = require("cv2")
    if not headless:
        problem = gui_problem(cv2)
        if problem:
            raise EdgeError("{}: run with --headless --port 8080 and open http://127.0.0.1:8080/ "
                            "(docs/demo.md)".format(problem))
    if not 1 <= jpeg_quality <= 100:
        raise EdgeError("--jpeg-quality must be 1-100, got {}".format(jpeg_quality))
    cfg = with_overrides(cfg, {"service.metrics.enabled": False})  # the service may hold the port
    trained = bool(read_model_info(cfg.model.path).get("trained"))
    hub = FrameHub({"warning": None if trained else UNTRAINED_WARNING, "source": cfg.source.uri,
                    "budget_ms": cfg.runtime.budget_ms}) if headless else None
    sink = OverlaySink(cfg.runtime.budget_ms, trained, hub, window=not headless, jpeg_quality=jpeg_quality)
    runtime = Runtime(cfg, log, [sink])
    enough = frames_done(frames)

    server = open_server(host, port, hub) if hub is not None else None

    announce = [server is not None]

    def until(pipeline: Any) -> Optional[str]:
        if announce[0] and pipeline.frame_id:
            announce[0] = False
            _announce(server, runtime)  # once the first frame is through: there is something to watch
        sink.recorder = pipeline.recorder
        return "window closed" if sink.quit else enough(pipeline)

    try:
        if server is not None:
            threading.Thread(target=server.serve_forever, name="edge-demo-http", daemon=True).start()
        report = run(runtime=runtime, until=until, table="edge demo")
        if hub is not None:
            report["jpegs_encoded"] = hub.encoded
        return report
    finally:
        if hub is not None:
            hub.close()
        if server is not None:
            server.shutdown()
            server.server_close()


def _announce(server: ThreadingHTTPServer, runtime: Any) -> None:
    bound_host, bound_port = server.server_address[:2]
    url = "http://{}:{}/".format(bound_host, bound_port)
    runtime.event("serving", url=url, stream=url + "stream.mjpg", stats=url + "stats.json")
    print("edge demo: open {} (stream {}stream.mjpg){}".format(
        url, url, "" if bound_host in ("127.0.0.1", "localhost", "::1") else
        "; WARNING: listening beyond this machine, anyone who can reach it can watch"), file=sys.stderr, flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)
    p.add_argument("--headless", action="store_true", help="no window: serve the annotated stream over HTTP")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port for --headless (default %(default)s; 0: a free one)")
    p.add_argument("--frames", type=int, default=0, help="stop after N frames (default: until stopped)")
    p.add_argument("--jpeg-quality", type=int, default=80, help="JPEG quality of the stream (default %(default)s)")


def register(subparsers: Any) -> None:
    add_command(subparsers, "demo", "camera demo: top-5, stage times, FPS, budget on the frame (window/MJPEG)",
                       __doc__, add_arguments, cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.frames < 0:
        raise EdgeError("--frames must be >= 0, got {}".format(args.frames))
    if not 0 <= args.port < 65536:
        raise EdgeError("--port must be 0-65535, got {}".format(args.port))
    run_demo(config_from_args(args), args.headless, args.host, args.port, args.frames, args.jpeg_quality)
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None, prog: str = "edge demo") -> int:
    return standalone_main(prog, __doc__, add_arguments, cmd_demo, argv)


if __name__ == "__main__":
    sys.exit(main())
