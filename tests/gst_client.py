"""The capture side of tests/test_gstreamer.py, run under /usr/bin/python3 with PYTHONPATH=<repo> (Debian's
python3-opencv is the OpenCV built with GStreamer; see the docstring there). Prints JSON lines.

  twin csi|usb-mjpg|usb-yuyv|rtsp WIDTH HEIGHT FPS FRAMES [URI CODEC]
      opens the software twin of that pipeline through edge's own GStreamerCapture and reads FRAMES frames
  grab URI CODEC TCP
      edge's one camera path (Cameras: its reader and watcher) with a reconnect policy on open_capture(uri); one
      line per frame and per source event, until stdin closes
  open URI
      open_capture(uri) on the GStreamer path and one frame: its shape and the description, or the error line
  serve PROBE
      runs PROBE (the caller's check for the apt packages), prints {"ready": true}, then reads twin and open
      commands from stdin, one JSON list a line, and answers each with its line plus "stderr" (what it wrote to
      fd 2) and "traceback" if it raised: one process for many (each would import cv2 again, about a CPU-second)
"""

import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
import traceback

from edge.config import CameraConfig, RuntimeConfig, SourceConfig
from edge.errors import EdgeError
from edge.sources import gstreamer
from edge.sources.cameras import Cameras
from edge.sources.source import open_capture
from edge.uri import parse_source

# The software twin: the off-Jetson element set with videotestsrc standing in for the cameras.
TWIN = dataclasses.replace(gstreamer.SOFTWARE, csi="videotestsrc is-live=true",
                           v4l2="videotestsrc is-live=true ! jpegenc")  # a USB camera that offers MJPG
RAW_ONLY = dataclasses.replace(TWIN, v4l2="videotestsrc is-live=true")  # a USB camera without MJPG


LOCK = threading.Lock()  # the reader thread and the main thread both print


def emit(**fields):
    with LOCK:
        print(json.dumps(fields), flush=True)


def twin(kind, width, height, fps, frames, uri="", codec="auto"):
    if kind == "csi":
        capture = gstreamer.GStreamerCapture(parse_source("csi://0"), [("NV12", gstreamer.csi_pipeline(
            0, width, height, fps, TWIN))], TWIN, fps)
    elif kind == "rtsp":
        pipeline = gstreamer.rtsp_pipeline(uri, codec, False, TWIN)
        capture = gstreamer.GStreamerCapture(parse_source(uri), [(codec, pipeline)], TWIN)
    else:
        elements = TWIN if kind == "usb-mjpg" else RAW_ONLY
        capture = gstreamer.GStreamerCapture(parse_source("/dev/video0"), gstreamer.usb_pipelines(
            "/dev/video0", width, height, fps, elements), elements, fps)
    capture.open()
    start = time.monotonic()
    shapes = {capture.read().shape for _ in range(frames)}
    seconds = time.monotonic() - start
    capture.close()
    return dict(description=capture.description, negotiated=capture.negotiated, pipeline=capture.target,
                shapes=sorted(shapes), seconds=seconds)


def grab(uri, codec, tcp):
    cfg = CameraConfig(name="camera", uri=uri, rtsp_codec=codec, rtsp_tcp=tcp == "tcp", timeout_s=2.0)
    cameras = Cameras([cfg], RuntimeConfig(budget_ms=3600e3), open_capture, reconnect_initial_s=0.05,
                      reconnect_max_s=0.4, on_event=lambda name, fields: emit(event=name, t=time.monotonic(), **fields),
                      give_up_at_start=False)
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    cameras.start()
    emit(event="started", source=cameras.description)
    while not closed.is_set():
        batch = cameras.next_batch(0.5)
        if batch is not None:
            frame = batch.frames[0]
            emit(frame=frame.seq, shape=frame.image.shape, t=frame.captured, **cameras.stats())
    cameras.stop()


def open_one(uri):
    try:
        capture = open_capture(SourceConfig(uri=uri))
        capture.open()
        image = capture.read()
        capture.close()
    except EdgeError as exc:
        return dict(error=str(exc))
    return dict(description=capture.description, shape=image.shape, pipeline=capture.target)


def answer(command, args):
    if command == "twin":
        return twin(args[0], *map(int, args[1:5]), *args[5:])
    return open_one(*args)


def serve(probe):
    exec(probe)  # so that "ready" promises what the caller's probe checks
    emit(ready=True)
    for line in sys.stdin:
        command, *args = json.loads(line)
        saved = os.dup(2)
        with tempfile.TemporaryFile("w+", errors="replace") as err:
            os.dup2(err.fileno(), 2)  # GStreamer's C code writes to fd 2 too
            try:
                out = answer(command, args)
            except Exception:
                out = dict(traceback=traceback.format_exc())
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
            err.seek(0)
            out["stderr"] = err.read()
        emit(**out)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command in ("twin", "open"):
        emit(**answer(command, args))
    elif command == "serve":
        serve(*args)
    else:
        grab(*args)
