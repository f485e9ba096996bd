"""edge.uri: a source URI is parsed once and refused, in one line naming source.uri, when it is not a well-formed URI
of its kind (the HOSTILE_* lists); every URI's credentials are masked in any text."""

import pytest

from edge.errors import EdgeError
from edge.uri import parse_source, redact

PASSWORD = "S3cretPass"


TOKEN = "t0kenValue"


HOSTILE_URIS = [
    "rtsp://127.0.0.1:18554/cam latency=0 ! fakesink videotestsrc num-buffers=3 ! pngenc ! multifilesink "
    "location=/tmp/pwn-%d.png rtspsrc location=rtsp://127.0.0.1:18554/cam",  # the injection
    "rtsp://h/cam!fakesink", "rtsp://h/cam\"", "rtsp://h/cam'", "rtsp://h/cam\\", "rtsp://h/ca m",
    "rtsp://h/cam\tx", "rtsp://h/cam\nx", "rtsp://h/cam\x00", "rtsp://h/cam\x1b[31m", "rtsp://h/caméra",
    "rtsp://h/%zz", "rtsp://h/a@b", "rtsp://user:pa/ss@h/", "rtsp://", "rtsp:///cam", "rtsp://h:0/",
    "rtsp://h:99999/", "rtsp://h:port/", "rtsp://[::1/", "rtsp://h$(id)/", "RTSP://h/x y",
    "csi://0 ! fakesink", "csi://-1", "csi://", "csi://0x1", "csi://١", "v4l2://0;id", "v4l2://99999",
    "/dev/video0 ! fakesink", "/dev/videoX", "ftp://h/x", "http://h/x", "file:///etc/passwd", "x\ny", "",
    "a" * 5000,
]


GOOD_URIS = [("rtsp://cam.local/stream", "rtsp"), ("rtsp://admin:p%40ss%21@10.0.0.2:8554/s?ch=1&subtype=0", "rtsp"),
             ("rtsp://[::1]:8554/x", "rtsp"), ("csi://1", "csi"), ("/dev/video2", "v4l2"), ("v4l2://0", "v4l2"),
             ("synthetic", "synthetic"), ("clips/a b!'.MP4", "file"), ("photos/", "file")]


@pytest.mark.parametrize("uri", HOSTILE_URIS)
def test_anything_but_a_well_formed_uri_is_refused_naming_source_uri(uri):
    with pytest.raises(EdgeError) as err:
        parse_source(uri)
    line = str(err.value)
    assert line.startswith("source.uri: ") and err.value.exit_code == 2
    assert "\n" not in line and "\x00" not in line and "\x1b" not in line and len(line) < 300


@pytest.mark.parametrize("uri, protocol", GOOD_URIS)
def test_well_formed_uris_of_every_kind_are_kept(uri, protocol):
    parsed = parse_source(uri)
    assert parsed.protocol == protocol and parsed.text == uri


@pytest.mark.parametrize("uri, parts", [
    ("rtsp://u:p@10.0.0.2:8554/s", {"location": "10.0.0.2", "port": 8554}), ("rtsp://cam/s", {"port": 554}),
    ("csi://1", {"device": 1}), ("/dev/video2", {"location": "/dev/video2", "device": 2}),
    ("v4l2://0", {"location": "/dev/video0", "device": 0}),
    ("clips/a.MP4", {"location": "clips/a.MP4", "extension": ".mp4"}), ("photos/", {"extension": ""})])
def test_the_parsed_resource_has_the_parts_the_sources_open(uri, parts):
    resource = parse_source(uri)
    assert {name: getattr(resource, name) for name in parts} == parts


HOSTILE_SECRETS = [
    "rtsp://admin:{}@cam/s".format(PASSWORD), "rtsp://{}@cam/s".format(PASSWORD),
    "rtsp://admin:{}@cam:8554/s?x=1".format(PASSWORD), "rtsp://a:{}@[::1]/s".format(PASSWORD),
    "'rtsp://admin:{}@cam/s'".format(PASSWORD), "\"rtsp://admin:{}@cam/s\"".format(PASSWORD),
    "rtsp://cam/s?token={}".format(TOKEN), "rtsp://cam/s?a=1&password={}&b=2".format(TOKEN),
    "rtsp://cam/s?X-Auth-Key={}".format(TOKEN), "RTSPS://admin:{}@cam/".format(PASSWORD),
    "source rtsp://u:{}@cam/s: no frame".format(PASSWORD), "http://u:{}@h/x".format(PASSWORD),
    # round 4: whatever the password holds, everything between :// and the last @ before the host is masked
    "rtsp://admin:{} PW@127.0.0.1/cam".format(PASSWORD), "rtsp://admin:{}\"PW@h/c".format(PASSWORD),
    "(got 'rtsp://admin:{}'PW@h/c')".format(PASSWORD), "rtsp://admin:{}<PW@h/c".format(PASSWORD),
    "rtsp://admin:{}\\PW@h/c".format(PASSWORD), "rtsp://admin:{}/PW@h/c".format(PASSWORD),
    '{{"uri": "rtsp://a:{}\\"b@h/x", "size": "96x72@50"}}'.format(PASSWORD),
    "rtsp://cam/s#{}".format(TOKEN),
]


@pytest.mark.parametrize("text", HOSTILE_SECRETS)
def test_redact_masks_userinfo_and_secret_query_values(text):
    shown = redact(text)
    assert PASSWORD not in shown and TOKEN not in shown and "***" in shown
    assert redact(shown) == shown


def test_redact_keeps_the_rest_of_the_line():
    line = "rtsp://u:p@cam:554/s?token=abc: no frame for 2 s"
    assert redact(line) == "rtsp://***@cam:554/s?token=***: no frame for 2 s"
    assert redact("rtsp://cam/s?a=1&sig=x:y&b=2") == "rtsp://cam/s?a=1&sig=***&b=2"
    assert redact("see /data/clip.mp4 and rtsp://cam/s?ch=1") == "see /data/clip.mp4 and rtsp://cam/s?ch=1"
