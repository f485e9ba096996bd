"""A real RTSP server for the tests: gst-rtsp-server streaming a live test pattern on 127.0.0.1.

Runs under Debian's /usr/bin/python3 (GstRtspServer comes from python3-gi + gir1.2-gst-rtsp-server-1.0):
  /usr/bin/python3 tests/rtsp_server.py --port 8554 --codec h264 --width 320 --height 240 --fps 30
prints `ready rtsp://127.0.0.1:PORT/cam` once it listens, serves until SIGTERM, and on SIGUSR1 drops every
connected client (a camera that resets its sessions) while it keeps listening.
"""

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

# Short GOP so a client that (re)connects gets a keyframe within a few frames.
ENCODERS = {
    "h264": "x264enc tune=zerolatency speed-preset=ultrafast key-int-max=10 ! rtph264pay name=pay0 pt=96",
    "h265": "x265enc tune=zerolatency speed-preset=ultrafast key-int-max=10 ! rtph265pay name=pay0 pt=96",
    "mjpeg": "jpegenc quality=80 ! rtpjpegpay name=pay0 pt=26",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--codec", choices=sorted(ENCODERS), default="h264")
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--fps", type=int, default=30)
    args = parser.parse_args()

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch("( videotestsrc is-live=true pattern=ball ! video/x-raw,width={},height={},framerate={}/1,"
                       "format=I420 ! {} )".format(args.width, args.height, args.fps, ENCODERS[args.codec]))
    factory.set_shared(True)
    server.get_mount_points().add_factory("/cam", factory)
    if server.attach(None) == 0:
        sys.exit("cannot listen on 127.0.0.1:{}".format(args.port))

    loop = GLib.MainLoop()

    def stop() -> bool:
        loop.quit()
        return GLib.SOURCE_REMOVE

    def drop_clients() -> bool:
        server.client_filter(lambda _server, _client: GstRtspServer.RTSPFilterResult.REMOVE)
        return GLib.SOURCE_CONTINUE

    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, stop)
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGUSR1, drop_clients)
    print("ready rtsp://127.0.0.1:{}/cam".format(args.port), flush=True)
    loop.run()


if __name__ == "__main__":
    main()
