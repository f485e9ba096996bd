"""The demo's annotated stream: the overlay sink (edge/service/overlay.py draws) and the small HTTP server that
serves its JPEGs and numbers to a browser (edge/cli/demo.py runs them). Each frame is JPEG-encoded at most
once, and only while a client waits for it (or once a second for /frame.jpg); the same bytes go to every client.
Connections are bounded and a request head has a total deadline (edge/service/http.py).
"""

import html
import json
import sys
import threading
import time
from http.server import HTTPServer
from typing import Any, Callable, Dict, Optional, Tuple
from urllib.parse import urlsplit

import numpy as np

from edge.errors import EdgeError, require
from edge.infer.pipeline import Result, Sink
from edge.service.http import BoundedThreadingMixIn, DeadlineRequestHandler, allowed_hosts
from edge.service.signals import StopFlag
from edge.uri import redact

BOUNDARY = "frame"
SNAPSHOT_MAX_AGE_S = 1.0  # with nobody streaming, frames are still encoded this often for /frame.jpg
CLIENT_TIMEOUT_S = 10.0  # a client that stops reading the stream is dropped after this long
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
                 jpeg_quality: int = 80, stop: Optional[StopFlag] = None,
                 on_first_frame: Optional[Callable[[], None]] = None):
        from edge.service.overlay import FpsMeter

        self.budget_ms = budget_ms
        self.trained = trained
        self.hub = hub
        self.window = window
        self.jpeg_quality = jpeg_quality
        self.stop = stop  # q or Esc in the window asks it to stop
        self.on_first_frame = on_first_frame  # once: there is something to watch
        self.fps = FpsMeter()
        self.last: Optional[np.ndarray] = None
        self.tiles: Dict[str, np.ndarray] = {}  # several cameras: each one's latest annotated frame

    def on_result(self, result: Result) -> None:
        from edge.service.overlay import draw_overlay, mosaic, stats_of

        cv2: Any = require("cv2")
        fps = self.fps.tick()
        annotated = draw_overlay(result.image, result, self.budget_ms, fps, self.trained)
        if result.camera:  # several cameras: a tile each
            self.tiles[result.camera] = annotated
            annotated = mosaic(dict(sorted(self.tiles.items())))
        self.last = annotated
        if self.window:
            cv2.imshow(WINDOW, annotated)
            if cv2.waitKey(1) & 0xFF in (27, ord("q")) and self.stop is not None:
                self.stop.request("window closed")
        if self.hub is not None:
            stats = stats_of(result, self.budget_ms, fps)
            jpeg = None
            if self.hub.wants_jpeg():  # once per frame at most, and only when someone will get it
                ok, buf = cv2.imencode(".jpg", annotated, [cv2.IMWRITE_JPEG_QUALITY, self.jpeg_quality])
                jpeg = buf.tobytes() if ok else None
            self.hub.publish(jpeg, stats)
        if self.on_first_frame is not None:
            self.on_first_frame()
            self.on_first_frame = None

    def close(self) -> None:
        if self.window:
            require("cv2").destroyAllWindows()


# The page, its style and its script: no inline code, so Content-Security-Policy default-src 'self' holds; every
# value from the model (labels) or the stream reaches the page as text (textContent), never as HTML.
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>jetson-edge demo</title>
<link rel="stylesheet" href="/demo.css"></head>
<body>
<div id="warn"{warn_class}>{warning}</div>
<img id="stream" src="/stream.mjpg" {size} alt="annotated camera stream">
<table><tbody id="stats"><tr><td>waiting for frames...</td></tr></tbody></table>
<script src="/demo.js"></script>
</body></html>
"""
STYLE = """body { background: #111; color: #ddd; font: 14px/1.4 sans-serif; margin: 12px; }
#warn { color: #111; background: #ffa500; padding: 4px 8px; }
#warn.none { display: none; }
img { display: block; max-width: 100%; margin: 8px 0; background: #000; }
td { padding: 1px 10px 1px 0; } .ok { color: #3c3; } .miss { color: #f44; }
"""
SCRIPT = """function row(k, v, cls) {
  var tr = document.createElement('tr'), a = document.createElement('td'), b = document.createElement('td');
  a.textContent = String(k); b.textContent = String(v); if (cls) b.className = cls;
  tr.appendChild(a); tr.appendChild(b); return tr;
}
function update() {
  fetch('/stats.json', {cache: 'no-store'}).then(function (r) { return r.json(); }).then(function (s) {
    var rows = [row('frame', s.frame), row('FPS', s.fps)];
    if (s.stage_ms) {
      rows.push(row('end_to_end', (s.stage_ms.end_to_end || 0).toFixed(2) + ' ms (budget ' + s.budget_ms + ' ms)',
                    s.within_budget ? 'ok' : 'miss'));
      ['preprocess', 'infer', 'postprocess'].forEach(function (k) {
        if (k in s.stage_ms) rows.push(row(k, s.stage_ms[k].toFixed(2) + ' ms')); });
    }
    if (s.frames) rows.push(row('misses', s.misses + ' of ' + s.frames));
    (s.top || []).forEach(function (t) { rows.push(row((100 * t.score).toFixed(1) + '%', t.label)); });
    var body = document.getElementById('stats');
    while (body.firstChild) body.removeChild(body.firstChild);
    rows.forEach(function (r) { body.appendChild(r); });
  }).catch(function () {});
}
update(); setInterval(update, 500);
"""
POLICY = "default-src 'self'"


class _Handler(DeadlineRequestHandler):
    server_version = "jetson-edge-demo"
    timeout = CLIENT_TIMEOUT_S  # a client that reads nothing for this long is disconnected

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        hub: FrameHub = self.server.hub  # type: ignore[attr-defined]
        path = urlsplit(self.path).path
        if path in ("/", "/index.html"):
            stats = hub.snapshot()
            size = stats.get("size")  # known once the first frame is out
            warning = stats.get("warning") or ""
            page = PAGE.format(size='width="{:d}" height="{:d}"'.format(*size) if size else "",
                               warning=html.escape(warning), warn_class="" if warning else ' class="none"')
            self._send(200, "text/html; charset=utf-8", page.encode("utf-8"))
        elif path == "/demo.css":
            self._send(200, "text/css; charset=utf-8", STYLE.encode("utf-8"))
        elif path == "/demo.js":
            self._send(200, "text/javascript; charset=utf-8", SCRIPT.encode("utf-8"))
        elif path == "/stats.json":
            self._send(200, "application/json", redact(json.dumps(hub.snapshot())).encode("utf-8"))
        elif path == "/frame.jpg":
            seq, jpeg = hub.next_jpeg(0 if hub.jpeg is None else hub.jpeg_seq - 1)
            if jpeg is None:
                self._send(503, "text/plain", b"no frame yet\n")
            else:
                self._send(200, "image/jpeg", jpeg)
        elif path == "/stream.mjpg":
            self._stream(hub)
        else:
            self._send(404, "text/plain", b"not found: / /stream.mjpg /stats.json /frame.jpg /demo.js /demo.css\n")

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", POLICY)
        self.send_header("X-Content-Type-Options", "nosniff")
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


class _Server(BoundedThreadingMixIn, HTTPServer):
    """At most MAX_CLIENTS connections (one thread each); more are answered 503 and closed at once, and a request
    head must arrive whole within edge.service.http.HEAD_DEADLINE_S (edge/service/http.py)."""

    max_clients = MAX_CLIENTS
    name = "edge demo"
    request_queue_size = 2 * MAX_CLIENTS  # a burst waits in the kernel's accept queue in order, not in SYN retries

    def __init__(self, address: Tuple[str, int], hub: FrameHub) -> None:
        super().__init__(address, _Handler)
        self.hub = hub
        self.allowed_hosts = allowed_hosts(address[0])

    def _refuse(self, request: Any) -> None:
        super()._refuse(request)
        self.hub.refused = self.refused
        if self.refused == 1:
            print("edge demo: {} clients connected; refusing more (counted in stats.json)".format(MAX_CLIENTS),
                  file=sys.stderr, flush=True)


def open_server(host: str, port: int, hub: FrameHub) -> HTTPServer:
    """Bind now (a taken port is an input error, found before the pipeline starts); serve later."""
    try:
        return _Server((host, port), hub)
    except OSError as exc:
        raise EdgeError("{}:{}: cannot listen: {} (pick another --port, or 0 for a free one)".format(
            host, port, exc.strerror or exc)) from None
