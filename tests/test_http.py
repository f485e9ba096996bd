"""edge.service.http: connection floods against the two HTTP servers (issue 19 item 16), with real sockets on
127.0.0.1: threads stay bounded, a request head has a total deadline however slowly it drips, and a real client is
served once the flood's connections have used up their deadline. Counts are small and bounded; nothing waits a fixed
time."""

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

import edge.service.http as http
from edge.service.metrics import MAX_SCRAPERS, MetricsSink

DEADLINE_S = 1.0


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch):
    monkeypatch.setattr(http, "HEAD_DEADLINE_S", DEADLINE_S)


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def get(url, timeout=10):
    """(status, body) of one GET; a 503 is an answer, not an exception."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def served_within(url, limit_s):
    """The first 200 for `url` within `limit_s` (polling), or the last answer."""
    deadline = time.monotonic() + limit_s
    answer = None
    while time.monotonic() < deadline:
        answer = get(url)
        if answer[0] == 200:
            return answer
        time.sleep(0.05)
    return answer


def test_half_open_connections_cost_bounded_threads_and_the_endpoint_recovers(capfd):
    sink = MetricsSink(30.0)
    port = sink.serve("127.0.0.1", 0)
    before = threading.active_count()
    flood = []
    try:
        for _ in range(4 * MAX_SCRAPERS):  # connect and send nothing (half-open, as in the report: 3000)
            flood.append(connect(port))
        held = threading.active_count() - before
        assert held <= MAX_SCRAPERS, held
        status, body = served_within("http://127.0.0.1:{}/metrics".format(port), 20 * DEADLINE_S)
        assert status == 200 and b"edge_frames_total" in body
        refused = [s.recv(64) for s in flood[MAX_SCRAPERS + 2:]]  # beyond the slots: answered 503 at once
        assert all(r.startswith(b"HTTP/1.0 503") for r in refused), refused[:3]
    finally:
        for s in flood:
            s.close()
        sink.close()
    assert "Traceback" not in capfd.readouterr().err


def test_one_flooding_peer_holds_at_most_half_the_slots_and_others_are_served(monkeypatch):
    """Issue 39: 200 slow heads from one host held every metrics slot, so /metrics and /healthz answered 503 to
    Prometheus and the release bake. One peer address now holds at most half the slots."""
    monkeypatch.setattr(http, "HEAD_DEADLINE_S", 60.0)  # the flood holds its slots for the whole test
    sink = MetricsSink(30.0)
    port = sink.serve("0.0.0.0", 0)
    flood = []
    try:
        for _ in range(MAX_SCRAPERS):  # from 127.0.0.2: another host as far as the server can tell
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0)))
        answers = [s.recv(64) for s in flood[MAX_SCRAPERS // 2:]]  # past half: refused at once
        assert all(a.startswith(b"HTTP/1.0 503") for a in answers), answers[:3]
        status, body = get("http://127.0.0.1:{}/metrics".format(port))  # while the first half still hold theirs
        assert status == 200 and b"edge_frames_total" in body
    finally:
        for s in flood:
            s.close()
        sink.close()


def test_a_dripping_head_is_dropped_at_its_total_deadline():
    """One header byte every DEADLINE_S/4: each byte comes in time, the head as a whole does not."""
    sink = MetricsSink(30.0)
    port = sink.serve("127.0.0.1", 0)
    try:
        sock = connect(port)
        started = time.monotonic()
        closed = False
        for byte in b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 200:
            try:
                sock.send(bytes([byte]))
                sock.settimeout(DEADLINE_S / 4)
                if sock.recv(64) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = True
                break
        assert closed, "the server kept a dripping client"
        assert time.monotonic() - started < 20 * DEADLINE_S  # dripping all 230 bytes would take 57 s
        sock.close()
    finally:
        sink.close()


def test_demo_slowloris_clients_do_not_lock_out_others():
    """The report: 32 clients dripping a header byte every 4 s gave 503 to everyone else for as long as they
    dripped. With a total deadline, the drippers are dropped and the next client is served."""
    from edge.service.demo_stream import MAX_CLIENTS, FrameHub, open_server

    hub = FrameHub({"source": "test"})
    hub.publish(b"\xff\xd8jpeg", {"frame": 1, "status": "ok"})
    server = open_server("127.0.0.1", 0, hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    drippers = [connect(port) for _ in range(MAX_CLIENTS)]
    stop = threading.Event()

    def drip():
        while not stop.wait(DEADLINE_S / 4):
            for s in drippers:
                try:
                    s.send(b"G")
                except OSError:
                    pass

    threading.Thread(target=drip, daemon=True).start()
    try:
        status, body = served_within("http://127.0.0.1:{}/stats.json".format(port), 20 * DEADLINE_S)
        assert status == 200 and b'"frame": 1' in body
        stop.set()
        answers = []
        for s in drippers:  # half were over their peer's share (503 at once), the rest closed at the deadline
            s.settimeout(10)
            answers.append(s.recv(64))
        assert answers[:MAX_CLIENTS // 2] == [b""] * (MAX_CLIENTS // 2), answers
        assert all(a.startswith(b"HTTP/1.0 503") for a in answers[MAX_CLIENTS // 2:]), answers
    finally:
        stop.set()
        for s in drippers:
            s.close()
        hub.close()
        server.shutdown()
        server.server_close()


def answer_to(port, request):
    """The status line of the answer to the raw bytes `request`."""
    with connect(port) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n", 1)[0].decode("latin-1")


def test_metrics_answer_only_to_their_own_names_and_never_http_0_9():
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil.example; answered 421. A
    request line over the head bound is 431, not parsed as a bare HTTP/0.9 request."""
    sink = MetricsSink(30.0)
    port = sink.serve("127.0.0.1", 0)
    try:
        for host, code in (("evil.example:{}".format(port), "421"), ("a.b.attacker.test.", "421"),
                           ("127.0.0.1:{}".format(port), "200"), ("localhost", "200"), ("[::1]:9108", "200"),
                           (socket.gethostname(), "200")):
            line = answer_to(port, "GET /metrics HTTP/1.1\r\nHost: {}\r\n\r\n".format(host).encode())
            assert line.split()[1] == code, (host, line)
        assert answer_to(port, b"GET /metrics HTTP/1.0\r\n\r\n").split()[1] == "200"  # no Host at all
        line = answer_to(port, b"GET /" + b"a" * (20 << 10) + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert line.startswith("HTTP/1.0 431"), line
    finally:
        sink.close()


def test_a_served_request_writes_no_access_line(capfd):
    """The journal gets no line per scrape (the handlers' log_message is quiet), only real failures."""
    sink = MetricsSink(30.0)
    port = sink.serve("127.0.0.1", 0)
    try:
        assert get("http://127.0.0.1:{}/metrics".format(port))[0] == 200
    finally:
        sink.close()
    assert "GET /metrics" not in capfd.readouterr().err
