"""The camera demo: the overlay drawn on real frames, JPEG encoding only when someone watches, and the headless
server end to end (status page, MJPEG stream, stats JSON, a real headless Chromium rendering the page)."""

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.request

import numpy as np
import pytest
import service_helpers as sh

from edge.infer.pipeline import Result
from edge.infer.postprocess import Prediction
from edge.service.demo_stream import FrameHub, OverlaySink
from edge.service.overlay import AMBER, GREEN, RED, draw_overlay, stats_of
from edge.store.artifact import UNTRAINED_WARNING

from conftest import REPO, assert_refused, colour_pixels, run_edge, write_video

SCRIPT = os.path.join(REPO, "scripts", "camera_demo.py")
SIZE = (320, 240)
SHOT = (900, 700)  # Chromium window (and screenshot) size


def make_result(e2e_ms, image=None, status="ok"):
    image = np.full((SIZE[1], SIZE[0], 3), 40, np.uint8) if image is None else image
    prediction = Prediction([3, 1, 4, 1, 5], [0.5, 0.2, 0.1, 0.05, 0.01], ["cat", "dog", "owl", "eel", "ant"])
    stages = {"capture": 1.0, "frame_age": 0.2, "preprocess": 1.5, "infer": 4.0, "postprocess": 0.1,
              "end_to_end": e2e_ms}
    return Result(7, 7, stages, prediction, status, None, image)


def test_overlay_budget_box_is_green_within_budget_and_red_over_it():
    frame = np.full((SIZE[1], SIZE[0], 3), 40, np.uint8)
    ok = draw_overlay(frame, make_result(12.0, frame), 30.0, 29.5, trained=True)
    over = draw_overlay(frame, make_result(45.0, frame, "miss"), 30.0, 29.5, trained=True)
    top_right_ok, top_right_over = ok[:12, -30:], over[:12, -30:]
    assert colour_pixels(top_right_ok, GREEN) > 200 and colour_pixels(top_right_ok, RED) == 0
    assert colour_pixels(top_right_over, RED) > 200 and colour_pixels(top_right_over, GREEN) == 0
    assert np.array_equal(frame, np.full_like(frame, 40))  # the pipeline's frame is not drawn on
    assert ok[:60, :100].mean() > frame[:60, :100].mean()  # white text in the top-left panel
    assert colour_pixels(ok, AMBER) == 0  # trained: no banner


def test_overlay_and_stats_read_the_pipelines_verdict_never_a_second_one():
    """The budget box and /stats.json say what the Result's status says (the latency recorder's miss), even where
    the overlay's budget argument would judge the frame otherwise."""
    frame = np.full((SIZE[1], SIZE[0], 3), 40, np.uint8)
    for status, e2e, colour in (("miss", 12.0, RED), ("ok", 45.0, GREEN), ("error", 12.0, RED)):
        result = make_result(e2e, frame, status)
        box = draw_overlay(frame, result, 30.0, 29.5, trained=True)[:12, -30:]
        assert colour_pixels(box, colour) > 200, status
        assert stats_of(result, 30.0, 29.5)["within_budget"] is (status == "ok")


def test_overlay_says_untrained():
    frame = np.full((SIZE[1], SIZE[0], 3), 40, np.uint8)
    out = draw_overlay(frame, make_result(12.0, frame), 30.0, 29.5, trained=False)
    assert colour_pixels(out[-20:], AMBER) > 1000  # the UNTRAINED WEIGHTS banner along the bottom


def test_the_mosaic_takes_a_camera_smaller_than_its_grid():
    """Two 1x1 cameras: a 0 px tile made cv2.resize assert and the demo died; each tile is at least MIN_TILE."""
    from edge.service.overlay import MIN_TILE

    sink = OverlaySink(30.0, trained=True)
    for camera, colour in (("a", 200), ("b", 90)):
        result = make_result(12.0, np.full((1, 1, 3), colour, np.uint8))
        result.camera = camera
        sink.on_result(result)
    assert sink.last.shape == (MIN_TILE[0], 2 * MIN_TILE[1], 3)
    middle = sink.last[MIN_TILE[0] // 2]  # the 1x1 frame fills a square, centred in its tile, black beside it
    assert middle[MIN_TILE[1] // 2].any() and middle[MIN_TILE[1] + MIN_TILE[1] // 2].any()
    assert not middle[:10].any() and not middle[MIN_TILE[1] - 10:MIN_TILE[1] + 10].any()


def test_the_mosaic_is_the_largest_frames_size_and_keeps_each_cameras_shape():
    """A 640x480 and a 320x240 camera: the mosaic is 640x480 (not the first camera's size), the small one scaled up
    into its tile; a 4:3 and a 16:9 camera keep their shapes (letterboxed), none squeezed."""
    from edge.service.overlay import mosaic

    small, large = np.full((240, 320, 3), 100, np.uint8), np.full((480, 640, 3), 100, np.uint8)
    assert mosaic({"s": small, "l": large}).shape == (480, 640, 3)
    wide = np.full((180, 320, 3), 100, np.uint8)  # 16:9 beside 4:3
    out = mosaic({"a": small, "w": wide})
    assert out.shape == (240, 320, 3)
    tile = out[:, 160:]  # 160x240 tile: the 16:9 frame is 160x90, centred, black above and below
    rows = np.flatnonzero(tile[:, 40:120].max(axis=(1, 2)) > 0)
    assert 85 <= rows.max() - rows.min() + 1 <= 95 and rows.min() > 60


def test_jpeg_is_encoded_only_when_someone_waits():
    hub = FrameHub()
    sink = OverlaySink(30.0, trained=True, hub=hub)
    for _ in range(10):  # nobody watching: one JPEG (for /frame.jpg), then none for a second
        sink.on_result(make_result(10.0))
    assert hub.encoded == 1 and hub.stats["frame"] == 7 and hub.stats["within_budget"] is True
    got = queue.Queue()
    waiter = threading.Thread(target=lambda: got.put(hub.next_jpeg(hub.jpeg_seq, timeout_s=30)))
    waiter.start()
    assert sh.wait_until(lambda: hub.waiting == 1, 30)
    sink.on_result(make_result(50.0, status="miss"))
    waiter.join(30)
    seq, jpeg = got.get_nowait()
    assert hub.encoded == 2 and seq == 2 and jpeg[:2] == b"\xff\xd8"
    assert hub.stats["within_budget"] is False


def test_window_mode_without_gui_says_use_headless(small_model, video_file):
    import cv2

    from edge.cli.demo import gui_problem

    if gui_problem(cv2) is None:
        pytest.skip("this OpenCV can open windows here")
    proc = subprocess.run([sys.executable, SCRIPT, "--model", small_model, "--source", video_file],
                          capture_output=True, encoding="utf-8", errors="replace", timeout=60, cwd=REPO)
    line = assert_refused(proc, "--headless")
    assert "no GUI" in line or "no display" in line


def test_port_in_use_is_one_line(small_model, video_file):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, SCRIPT, "--model", small_model, "--source", video_file, "--headless",
                               "--port", str(port)], capture_output=True,
                               encoding="utf-8", errors="replace", timeout=60, cwd=REPO)
    assert_refused(proc, "cannot listen")


@contextlib.contextmanager
def running_demo(model, tmp_path):
    """A running headless demo of `model` on a free port; yields (base url, raw frames written, process)."""
    video = tmp_path / "clip.avi"
    raw = write_video(video, frames=30, size=SIZE)
    proc = subprocess.Popen([sys.executable, SCRIPT, "--model", model, "--source", str(video), "--headless",
                             "--port", "0", "--budget-ms", "1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            encoding="utf-8", errors="replace", cwd=REPO)
    try:
        url = sh.JsonLines(proc).wait_for("serving", timeout=60)["url"]
        assert url.startswith("http://127.0.0.1:")
        yield url, raw, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def demo(small_model, tmp_path):
    with running_demo(small_model, tmp_path) as running:
        yield running


def wait_for_frames(url, timeout=30):
    def framed():
        with urllib.request.urlopen(url + "stats.json", timeout=10) as resp:
            return json.loads(resp.read())["frame"] > 0

    assert sh.wait_until(framed, timeout, 0.1), "no frame within {} s".format(timeout)


def read_mjpeg_frames(url, count, timeout=20):
    """(content type, [JPEG bytes]) of the first `count` parts of a multipart/x-mixed-replace stream."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        ctype = resp.headers["Content-Type"]
        boundary = ("--" + ctype.split("boundary=")[1]).encode()
        parts = []
        while len(parts) < count:
            line = resp.readline()
            if not line:
                break
            if line.strip() != boundary:
                continue
            headers = {}
            while True:
                h = resp.readline().strip()
                if not h:
                    break
                k, v = h.decode().split(":", 1)
                headers[k.lower()] = v.strip()
            assert headers["content-type"] == "image/jpeg"
            parts.append(resp.read(int(headers["content-length"])))
    return ctype, parts


def test_headless_serves_page_stream_and_stats(demo):
    import cv2

    url, raw, proc = demo
    with urllib.request.urlopen(url, timeout=10) as resp:  # before the first frame: no size yet, warning already
        assert UNTRAINED_WARNING in resp.read().decode()
    wait_for_frames(url)
    with urllib.request.urlopen(url, timeout=10) as resp:
        page = resp.read().decode()
        assert resp.headers["Content-Type"].startswith("text/html")
    assert '<img id="stream" src="/stream.mjpg" width="320" height="240"' in page
    assert '<script src="/demo.js">' in page and UNTRAINED_WARNING in page
    with urllib.request.urlopen(url + "demo.js", timeout=10) as resp:
        script = resp.read().decode()
        assert resp.headers["Content-Security-Policy"] == "default-src 'self'"
    assert "/stats.json" in script and "textContent" in script and "innerHTML" not in script

    ctype, parts = read_mjpeg_frames(url + "stream.mjpg", 4)
    assert ctype == "multipart/x-mixed-replace; boundary=frame" and len(parts) == 4
    assert len(set(parts)) == 4  # four different frames, not one repeated
    for jpeg in parts:
        frame = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert frame.shape == (SIZE[1], SIZE[0], 3)
        # overlay pixels differ from every raw frame: green budget box top right, amber banner at the bottom
        assert colour_pixels(frame[:10, -25:], GREEN) > 150 and colour_pixels(raw[0][:10, -25:], GREEN) == 0
        assert colour_pixels(frame[-8:], AMBER, tol=40) > 1000
        assert min(np.abs(frame.astype(int) - r.astype(int)).mean() for r in raw) > 5

    with urllib.request.urlopen(url + "stats.json", timeout=10) as resp:
        stats = json.loads(resp.read())
    assert stats["frame"] > 0 and stats["fps"] > 0 and stats["budget_ms"] == 1000.0
    assert stats["within_budget"] is True and stats["size"] == list(SIZE)
    assert {"preprocess", "infer", "postprocess", "end_to_end"} <= set(stats["stage_ms"])
    assert len(stats["top"]) == 5 and all(0 <= t["score"] <= 1 for t in stats["top"])
    assert stats["warning"] == UNTRAINED_WARNING and stats["jpegs_encoded"] >= 4

    with urllib.request.urlopen(url + "frame.jpg", timeout=10) as resp:
        assert resp.headers["Content-Type"] == "image/jpeg"
        single = cv2.imdecode(np.frombuffer(resp.read(), np.uint8), cv2.IMREAD_COLOR)
    assert single.shape == (SIZE[1], SIZE[0], 3)

    proc.send_signal(signal.SIGTERM)  # stops cleanly with the latency table
    assert proc.wait(15) == 0
    err = proc.stderr.read()
    assert "stage (ms)" in err and "end_to_end" in err


def test_status_page_in_headless_chromium(demo, tmp_path):
    import cv2

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("SKIP reason: chromium not installed (scripts/bootstrap.sh --dev installs Debian's chromium)")
        pytest.skip("chromium not installed (scripts/bootstrap.sh --dev installs it)")
    url, _, _ = demo
    wait_for_frames(url)
    shot = tmp_path / "page.png"
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--user-data-dir={}".format(tmp_path / "profile"), "--hide-scrollbars",
                           "--window-size={},{}".format(*SHOT), "--screenshot={}".format(shot), url],
                          capture_output=True, encoding="utf-8", errors="replace", timeout=90)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    image = cv2.imread(str(shot))
    assert image is not None and (image.shape[1], image.shape[0]) == SHOT
    assert colour_pixels(image, GREEN, tol=25) > 150  # the overlay's budget box, rendered from the MJPEG stream
    assert colour_pixels(image, AMBER, tol=25) > 2000  # the untrained banner (page and frame)
    if os.environ.get("EDGE_KEEP_SCREENSHOT"):
        shutil.copy(str(shot), os.environ["EDGE_KEEP_SCREENSHOT"])


def test_edge_demo_is_registered():
    proc = run_edge("demo", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--headless" in proc.stdout and "--port" in proc.stdout


def chromium_or_skip():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("SKIP reason: chromium not installed (scripts/bootstrap.sh --dev installs Debian's chromium)")
        pytest.skip("chromium not installed (scripts/bootstrap.sh --dev installs it)")
    return chromium


def test_labels_reach_the_page_as_text_never_as_html(small_model, tmp_path):
    """Every label a script tag: the page shows them as text (its DOM holds no element they made), under a
    Content-Security-Policy that would block inline script anyway."""
    chromium = chromium_or_skip()
    model = tmp_path / "m.onnx"
    shutil.copyfile(small_model, str(model))  # the user's own model and labels: no model info
    (tmp_path / "m.labels.txt").write_text("".join(
        "<img src=x onerror=\"document.title='pwned{}'\">\n".format(i) for i in range(1000)), encoding="utf-8")
    with running_demo(str(model), tmp_path) as (url, _, _):
        wait_for_frames(url)
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.headers["Content-Security-Policy"] == "default-src 'self'"
        proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               "--user-data-dir={}".format(tmp_path / "profile"), "--virtual-time-budget=4000",
                               "--dump-dom", url], capture_output=True, encoding="utf-8", errors="replace", timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert "&lt;img src=x onerror=" in dom  # the labels, shown as text in the stats table
    assert "<img src=\"x\"" not in dom and "pwned" not in dom.split("<body>")[0]  # no element, no script ran


def test_the_demo_answers_only_to_its_own_names(demo):
    url, _, _ = demo
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    for host, code in (("evil.example:{}".format(port), 421), ("rebind.attacker.test", 421),
                       ("127.0.0.1:{}".format(port), 200), ("localhost:{}".format(port), 200),
                       ("[::1]:{}".format(port), 200)):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall("GET /stats.json HTTP/1.1\r\nHost: {}\r\n\r\n".format(host).encode())
            answer = sock.recv(4096).decode("latin-1")
        assert answer.split()[1] == str(code), (host, answer[:200])
