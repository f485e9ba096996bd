"""The camera demo: the overlay drawn on real frames, JPEG encoding only when someone watches, and the headless
server end to end (status page, MJPEG stream, stats JSON, a real headless Chromium rendering the page)."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
import service_helpers as sh

from edge.service.overlay import AMBER, GREEN
from edge.store.artifact import UNTRAINED_WARNING

from conftest import REPO, assert_refused, colour_pixels, run_edge, write_video

SCRIPT = os.path.join(REPO, "scripts", "camera_demo.py")
SIZE = (320, 240)
SHOT = (900, 700)  # Chromium window (and screenshot) size


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
